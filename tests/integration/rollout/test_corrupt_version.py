"""A version whose bytes do not match their checksums never reaches the engine: the replica's
switch fails, the engine keeps generating with its old weights, and no file of that version is
left for an engine to load (over the data plane and over gRPC streams).

The replica receives the version here (``shared_memory=False``): the damage stands for bytes
changed on their way, which a version mapped from paramsync's memory never takes (its engine
reads the very memory paramsync verified as the upload landed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.engine.client import EngineClient, SamplingParams
from services.paramsync.client import ParamSyncClient
from services.rollout.weight_sync import SyncFailed
from tests.integration.paramsync.harness import running_service
from tests.integration.rollout.conftest import EngineProcess
from tests.integration.rollout.replica_harness import bare_weight_sync, new_policy


async def greedy_logprobs(client: EngineClient) -> list[float]:
    (out,) = await client.generate([5, 6, 7], SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True))
    return out.logprobs


@pytest.mark.parametrize("data_plane", [True, False], ids=["dataplane", "grpc"])
async def test_a_corrupt_version_leaves_the_engine_on_its_weights_and_no_loadable_file(
    engine: EngineProcess, tiny_model_dir: Path, tmp_path: Path, data_plane: bool
) -> None:
    async with (
        running_service() as (address, service),
        ParamSyncClient(address, data_plane=data_plane, max_sync_retries=0, shared_memory=False) as paramsync,
        EngineClient(engine.url) as client,
    ):
        old = int(await client.weight_version())
        before = await greedy_logprobs(client)
        await paramsync.publish(old + 1, new_policy(tiny_model_dir, 1.1))
        # Damaged after paramsync checked the upload: only the replica's own check can catch it.
        service.store.get(old + 1).data[100] ^= 0xFF
        sync, state = bare_weight_sync(paramsync, client, "r-corrupt", "abort_resume", tmp_path / "weights", old)
        try:
            with pytest.raises(SyncFailed):
                await asyncio.wait_for(sync.run(), 60)
            left = sorted(sync.files.root.rglob("*.safetensors"))
        finally:
            sync.close()
        version_after, after = await client.weight_version(), await greedy_logprobs(client)
        table = await paramsync.list_replicas()

    assert left == [], "no file of the corrupt version is left to load"
    assert state.held_version == old and version_after == str(old)
    assert after == before, "the engine generates with its old weights"
    (row,) = table.replicas
    assert row.replica_id == "r-corrupt" and "checksum" in row.last_error
    assert sync.metrics.registry.registry.get_sample_value("relayrl_rollout_param_sync_failures_total") == 1
