"""A replica with a real paramsync and a real queue: it waits for the version a prompt needs,
fetches it (gRPC chunks, or the announced directory for the disk transport), loads it into the
engine, reports it, and only then starts the prompt."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from relayrl.redis_process import RedisProcess
from services.engine.client import EngineClient
from services.paramsync.client import ParamSyncClient
from services.queue.client import QueueClient
from services.queue.config import QueueSettings
from services.queue.server import start_queue_server
from services.rollout.config import RolloutSettings
from services.rollout.weight_sync import versions_dir
from tests.integration.rollout.conftest import EngineProcess, queue_overrides
from tests.integration.rollout.replica_harness import (
    new_policy,
    paramsync_service,
    prompt,
    pull_groups,
    running_replica,
    sample_value,
)
from tests.waiting import wait_until_async


@pytest.mark.parametrize("transport", ["grpc", "disk"])
async def test_prompt_waits_for_its_min_start_version_then_runs_on_it(
    engine: EngineProcess, redis_server: RedisProcess, run_id: str, tiny_model_dir: Path, tmp_path: Path, transport: str
) -> None:
    queue = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id)))
    try:
        async with (
            EngineClient(engine.url) as client,
            paramsync_service(transport=transport, shared_dir=str(tmp_path / "shared")) as paramsync_address,
            ParamSyncClient(paramsync_address) as paramsync,
            QueueClient(queue.grpc_address) as q,
        ):
            old = int(await client.weight_version())
            new = old + 1
            shm_versions = versions_dir(RolloutSettings(replica_id="r-sync"), tmp_path / "weights")
            assert shm_versions.parent == Path("/dev/shm")
            async with running_replica(
                engine.url,
                queue.grpc_address,
                replica_id="r-sync",
                paramsync_address=paramsync_address,
                weights_dir=str(tmp_path / "weights"),
            ) as replica:
                await wait_until_async(replica.state.ready, what="engine ready")
                await q.release([prompt(40, min_start_version=new)])
                await asyncio.sleep(1.0)  # what is under test: the prompt does not start meanwhile
                assert (await q.prompt_stats()).waiting == 1, "a prompt needing a newer policy must not start"
                await paramsync.publish(new, new_policy(tiny_model_dir, 1.1))
                (group,) = await pull_groups(queue.grpc_address, 1, version=new)
                status = replica.state.status()
                syncs = sample_value(replica, "param_sync_requests_total")
                on_disk = sorted((tmp_path / "weights").rglob("*.safetensors"))
                in_memory = sorted(shm_versions.rglob("*.safetensors"))
            table = await paramsync.list_replicas()
            assert (await client.model_info())["weight_version"] == str(new)
            assert (await client.update_weights_from_disk(str(tiny_model_dir), weight_version=new + 1)).success
    finally:
        await queue.stop()
    assert all(s.policy_versions == [new] * len(s.response_token_ids) for s in group.samples)
    assert status.weight_version == new and status.latest_version == new
    assert syncs == 1
    assert [(r.replica_id, r.version) for r in table.replicas] == [("r-sync", new)]
    # A pulled version lives in shared memory only, and is gone once the replica stops.
    assert on_disk == []
    assert in_memory == ([shm_versions / f"v{new:012d}" / "model.safetensors"] if transport == "grpc" else [])
    assert not shm_versions.exists()


async def test_a_replica_leases_prompts_for_its_new_weights_without_waiting_out_a_lease_call(
    engine: EngineProcess, redis_server: RedisProcess, run_id: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """With a 30 s lease block, a lease sent at the old version must not hold the replica back
    once the new version is applied: every synchronous step would otherwise lose that wait."""
    queue = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id)))
    try:
        async with (
            EngineClient(engine.url) as client,
            paramsync_service(transport="grpc", shared_dir=str(tmp_path / "shared")) as paramsync_address,
            ParamSyncClient(paramsync_address) as paramsync,
            QueueClient(queue.grpc_address) as q,
        ):
            new = int(await client.weight_version()) + 1
            async with running_replica(
                engine.url,
                queue.grpc_address,
                replica_id="r-next",
                paramsync_address=paramsync_address,
                weights_dir=str(tmp_path / "weights"),
                lease_block_timeout_s=30.0,
            ) as replica:
                await wait_until_async(replica.state.ready, what="engine ready")
                await q.release([prompt(41, min_start_version=new)])
                await asyncio.sleep(0.5)  # the replica has asked for prompts at its old version by now
                await paramsync.publish(new, new_policy(tiny_model_dir, 1.1))
                (group,) = await pull_groups(queue.grpc_address, 1, timeout_s=15.0, version=new)
    finally:
        await queue.stop()
    assert all(s.policy_versions == [new] * len(s.response_token_ids) for s in group.samples)
