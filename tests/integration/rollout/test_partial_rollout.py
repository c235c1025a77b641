"""Weight updates mid-generation, end to end: a real paramsync service announces a new version,
the replica's WeightSync fetches it over gRPC and switches the real engine while a sample is
being generated; each partial-rollout mode must record the right per-token versions."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.engine.client import EngineClient, SamplingParams
from services.paramsync.client import ParamSyncClient
from services.rollout.generation import generate_group
from services.rollout.weight_sync import WeightSync
from tests.integration.rollout.conftest import EngineProcess
from tests.integration.rollout.replica_harness import bare_weight_sync, new_policy, paramsync_service
from tests.waiting import wait_until_async


class GenerateLog(EngineClient):
    """The real client, keeping the body of every ``/generate`` it sends and the path of every call."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        self.generates: list[dict[str, Any]] = []
        self.paths: list[str] = []

    async def _send_once(self, method: str, path: str, json: Any) -> httpx.Response:
        self.paths.append(path)
        if path == "/generate":
            self.generates.append(json)
        return await super()._send_once(method, path, json)


@pytest.mark.parametrize("mode", ["abort_resume", "in_place", "restart"])
async def test_partial_rollout_records_per_token_versions(
    engine: EngineProcess, tiny_model_dir: Path, tmp_path: Path, mode: str
) -> None:
    budget = 400
    async with (
        paramsync_service() as address,
        ParamSyncClient(address) as paramsync,
        GenerateLog(engine.url) as client,
    ):
        old = int(await client.weight_version())
        sync, state = bare_weight_sync(paramsync, client, "r-partial", mode, tmp_path / "weights", old)
        syncing = asyncio.create_task(sync.run())
        sample = asyncio.create_task(
            generate_group(client, [5, 6, 7], SamplingParams(max_new_tokens=budget, ignore_eos=True), 2, mode, old, "s")
        )
        start = (await client.model_info())["generated_tokens"]
        await wait_until_async(lambda: _generated_since(client, start, 20), what="generation under way")
        await paramsync.publish(old + 1, new_policy(tiny_model_dir, 1.1))
        results = await asyncio.wait_for(sample, 60)
        await wait_until_async(lambda: state.held_version == old + 1, what="version switch")
        syncing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await syncing
        sync.close()
        table = await paramsync.list_replicas()
        stages = _stage_seconds(sync)
        assert (await client.update_weights_from_disk(str(tiny_model_dir), weight_version=old + 2)).success

    new = old + 1
    assert len(results) == 2, "both samples of the group finish"
    for result in results:
        assert len(result.output_ids) == budget == len(result.logprobs) == len(result.versions)
        assert result.finish_reason == "length"
        assert result.versions == sorted(result.versions), "versions only move forward within a sample"
        assert set(result.versions) <= {old, new}
        assert result.versions[-1] == new, "the sample finished after the switch"
        if mode == "restart":
            assert result.resubmits >= 1
            assert set(result.versions) == {new}, "a restarted sample keeps nothing from the old policy"
        else:
            assert result.versions[0] == old, "tokens generated before the switch keep their version"
            assert result.resubmits == (1 if mode == "abort_resume" else 0)
    # The group is one request; samples the switch interrupted go back together, in one more.
    batches = [len(body["input_ids"]) if isinstance(body["input_ids"][0], list) else 1 for body in client.generates]
    assert batches == ([1] if mode == "in_place" else [1, 2])
    assert client.generates[0]["sampling_params"]["n"] == 2
    assert [(r.replica_id, r.version) for r in table.replicas] == [("r-partial", new)]
    # One version fetched and applied; the pause holds the apply and nothing of the fetch.
    assert {k: count for k, (count, _) in stages.items()} == {
        "weight_fetch": 1,
        "weight_apply": 1,
        "generation_paused": 1,
    }
    assert 0 < stages["weight_apply"][1] <= stages["generation_paused"][1]
    # Only in_place freezes requests around the update; the abort modes switch in one update call.
    switch_calls = [p for p in client.paths if p in {"/pause_generation", "/continue_generation"}]
    assert switch_calls == (["/pause_generation", "/continue_generation"] if mode == "in_place" else [])


def _stage_seconds(sync: WeightSync) -> dict[str, tuple[float, float]]:
    """(count, sum) of each stage histogram the switch records."""
    sample = sync.metrics.registry.registry.get_sample_value
    return {
        stage: (sample(f"relayrl_rollout_{stage}_seconds_count"), sample(f"relayrl_rollout_{stage}_seconds_sum"))
        for stage in ("weight_fetch", "weight_apply", "generation_paused")
    }


async def _generated_since(client: EngineClient, start: int, count: int) -> bool:
    return (await client.model_info())["generated_tokens"] >= start + count
