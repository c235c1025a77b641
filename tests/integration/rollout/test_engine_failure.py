"""An engine killed mid-generation: the replica goes not-ready, and no leased prompt is lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from relayrl.redis_process import RedisProcess
from services.queue.client import QueueClient
from services.queue.config import QueueSettings
from services.queue.server import start_queue_server
from tests.integration.rollout.conftest import EngineProcess, queue_overrides
from tests.integration.rollout.replica_harness import prompt, pull_groups, running_replica, wait_until


async def test_engine_killed_mid_generation_loses_no_prompt(
    start_engine: Callable[..., EngineProcess], redis_server: RedisProcess, run_id: str
) -> None:
    engine = start_engine()
    queue = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id, lease_timeout_s=1.5)))
    try:
        async with (
            QueueClient(queue.grpc_address) as q,
            running_replica(engine.url, queue.grpc_address, max_new_tokens=150) as replica,
        ):
            await wait_until(replica.ready, what="engine ready")
            await q.release([prompt(i, n=2) for i in range(2)])
            await wait_until(lambda: replica.status().in_flight > 0, what="requests in flight")
            engine.kill()
            await wait_until(lambda: not replica.ready(), what="replica not ready")
            assert (await q.prompt_stats()).total_completed == 0
            restarted = await asyncio.to_thread(start_engine, engine.port)
            await wait_until(replica.ready, timeout_s=30, what="replica ready again")
            groups = await pull_groups(queue.grpc_address, 2, timeout_s=60)
            stats = await q.prompt_stats()
            errors = replica.status().generation_errors
        restarted.stop()
    finally:
        await queue.stop()
    assert sorted(g.prompt_id for g in groups) == ["test/0", "test/1"]
    assert all(len(g.samples) == 2 for g in groups)
    assert stats.total_completed == 2 and stats.total_reissued >= 1
    assert errors >= 1
