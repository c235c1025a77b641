"""An engine killed mid-generation: the replica goes not-ready, and no leased prompt is lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from relayrl.redis_process import RedisProcess
from services.engine.client import EngineClient
from services.paramsync.client import ParamSyncClient
from services.queue.client import QueueClient
from services.queue.config import QueueSettings
from services.queue.server import start_queue_server
from tests.integration.rollout.conftest import EngineProcess, queue_overrides
from tests.integration.rollout.replica_harness import (
    new_policy,
    paramsync_service,
    prompt,
    pull_groups,
    running_replica,
)
from tests.waiting import wait_until_async


async def test_engine_killed_mid_generation_loses_no_prompt(
    start_engine: Callable[..., EngineProcess], redis_server: RedisProcess, run_id: str
) -> None:
    engine = start_engine()
    # Long enough that no lease lapses while the replica renews it on a loaded machine (1.5 s did), and
    # within the groups' 60 s wait: a prompt not given back still comes back, re-issued, and is counted.
    queue = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id, lease_timeout_s=20)))
    try:
        async with (
            QueueClient(queue.grpc_address) as q,
            running_replica(engine.url, queue.grpc_address, max_new_tokens=150) as replica,
        ):
            await wait_until_async(replica.state.ready, what="engine ready")
            await q.release([prompt(i, n=2) for i in range(2)])
            await wait_until_async(lambda: replica.state.status().in_flight > 0, what="requests in flight")
            engine.kill()
            await wait_until_async(lambda: not replica.state.ready(), what="replica not ready")
            assert (await q.prompt_stats()).total_completed == 0
            restarted = await asyncio.to_thread(start_engine, engine.port)
            await wait_until_async(replica.state.ready, timeout_s=30, what="replica ready again")
            groups = await pull_groups(queue.grpc_address, 2, timeout_s=60)
            stats = await q.prompt_stats()
            errors = replica.state.status().generation_errors
        restarted.stop()
    finally:
        await queue.stop()
    assert sorted(g.prompt_id for g in groups) == ["test/0", "test/1"]
    assert all(len(g.samples) == 2 for g in groups)
    # Given back the moment their generation failed, not re-issued after the lease timeout.
    assert stats.total_completed == 2 and stats.total_reissued == 0
    assert stats.abandoned_by_reason["generation_error"] >= 1 and not stats.dropped_by_reason
    assert errors >= 1


async def test_restarted_engine_gets_the_current_weights_back(
    start_engine: Callable[..., EngineProcess],
    redis_server: RedisProcess,
    run_id: str,
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    engine = start_engine()
    queue = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id)))
    try:
        async with (
            paramsync_service() as paramsync_address,
            ParamSyncClient(paramsync_address) as paramsync,
            EngineClient(engine.url) as client,
            running_replica(
                engine.url, queue.grpc_address, paramsync_address=paramsync_address, weights_dir=str(tmp_path / "w")
            ) as replica,
        ):
            await wait_until_async(replica.state.ready, what="engine ready")
            await paramsync.publish(3, new_policy(tiny_model_dir, 1.1))
            await wait_until_async(lambda: replica.state.held_version == 3, what="version 3 held")
            engine.kill()
            await wait_until_async(lambda: not replica.state.ready(), what="replica not ready")
            await asyncio.to_thread(start_engine, engine.port)
            await wait_until_async(replica.state.ready, timeout_s=30, what="replica ready again")
            await wait_until_async(client.weight_version, what="engine answers")
            await wait_until_async(lambda: _engine_at(client, "3"), timeout_s=20, what="engine back at version 3")
            await wait_until_async(lambda: replica.state.held_version == 3, what="replica holds version 3 again")
    finally:
        await queue.stop()


async def _engine_at(client: EngineClient, version: str) -> bool:
    return await client.weight_version() == version
