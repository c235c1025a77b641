"""Versions a trainer on this host also shares by handle (shared memory here, CUDA IPC on a GPU):
a replica's WeightSync loads them into the real engine with nothing fetched, one
``/update_weights_from_tensor`` per bucket under one pause, and loads the bytes paramsync holds
when the engine cannot open the handles, or opens only some of them. Either way the engine ends
on exactly the weights the version's bytes give."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing
from safetensors.torch import save_file

from services.engine.client import EngineClient, SamplingParams
from services.engine.tensor_updates import FLATTENED_BUCKET, flattened_bucket, serialize
from services.paramsync.client import ParamSyncClient
from services.paramsync.manifest import WeightHandles
from services.rollout.state import ReplicaState
from services.rollout.weight_sync import WeightSync
from tests.integration.rollout.conftest import REPO, EngineProcess
from tests.integration.rollout.replica_harness import bare_weight_sync, new_policy, paramsync_service
from tests.waiting import wait_until_async

# The engine calls a switch makes (generation itself is left out).
_SWITCH_PATHS = {
    "/pause_generation",
    "/continue_generation",
    "/update_weights_from_tensor",
    "/update_weights_from_disk",
}


class SwitchLog(EngineClient):
    """The real client, keeping the path and body of every call a weight switch makes."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        self.calls: list[tuple[str, Any]] = []

    async def _send_once(self, method: str, path: str, json: Any) -> Any:
        if path in _SWITCH_PATHS:
            self.calls.append((path, json))
        return await super()._send_once(method, path, json)


def shared_buckets(tensors: dict[str, torch.Tensor], count: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The trainer's side: ``tensors`` in ``count`` flattened buckets in shared memory, and one
    payload each. The caller keeps the buckets alive while the engine may open them, as a trainer
    must (a CUDA IPC handle dies with its tensor)."""
    names = list(tensors)
    parts = [names[i::count] for i in range(count)]
    buckets = [flattened_bucket({name: tensors[name] for name in part}) for part in parts]
    for bucket in buckets:
        bucket["flattened_tensor"].share_memory_()
    return buckets, [serialize(bucket) for bucket in buckets]


def payloads_of_an_exited_trainer(model_dir: Path) -> list[str]:
    """Two buckets of the model shared by a process that has since exited (a restarted trainer):
    their memory is gone with it."""
    code = (
        "import sys, torch.multiprocessing\n"
        "from safetensors.torch import load_file\n"
        "from services.engine.tensor_updates import flattened_bucket, serialize\n"
        "torch.multiprocessing.set_sharing_strategy('file_system')\n"
        "tensors = load_file(sys.argv[1])\n"
        "names = list(tensors)\n"
        "for part in (names[0::2], names[1::2]):\n"
        "    bucket = flattened_bucket({name: tensors[name] for name in part})\n"
        "    bucket['flattened_tensor'].share_memory_()\n"
        "    print(serialize(bucket))\n"
    )
    args = [sys.executable, "-c", code, str(model_dir / "model.safetensors")]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120, check=True).stdout.split()


def handles_here(payloads: list[str]) -> WeightHandles:
    return WeightHandles(socket.gethostname(), FLATTENED_BUCKET, tuple(payloads))


async def greedy_logprobs(client: EngineClient) -> list[float]:
    (out,) = await client.generate([5, 6, 7], SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True))
    return out.logprobs


async def logprobs_by_bytes(client: EngineClient, tensors: dict[str, torch.Tensor], directory: Path) -> list[float]:
    """What the engine generates once ``tensors`` are loaded from a file (the bytes route's way)."""
    directory.mkdir(parents=True)
    save_file(tensors, str(directory / "model.safetensors"))
    version = int(await client.weight_version()) + 1
    assert (await client.update_weights_from_disk(str(directory), weight_version=version)).success
    return await greedy_logprobs(client)


@contextlib.asynccontextmanager
async def original_weights_after(client: EngineClient, model_dir: Path) -> AsyncIterator[None]:
    """Leaves the shared engine on the original weights, at a newer version, as its fixture asks."""
    try:
        yield
    finally:
        version = int(await client.weight_version()) + 1
        assert (await client.update_weights_from_disk(str(model_dir), weight_version=version)).success


async def publish_and_load(
    sync: WeightSync,
    state: ReplicaState,
    paramsync: ParamSyncClient,
    version: int,
    tensors: dict[str, torch.Tensor],
    handles: WeightHandles,
) -> None:
    """Publishes ``version`` and waits until the replica's WeightSync loaded and reported it."""
    syncing = asyncio.create_task(sync.run())
    try:
        await paramsync.publish(version, tensors, handles=handles)

        async def reported() -> bool:
            if syncing.done():
                syncing.result()  # the sync failed: its error says why
            table = await paramsync.list_replicas()
            return state.held_version == version and [r.version for r in table.replicas] == [version]

        await wait_until_async(reported, what=f"version {version} loaded and reported")
    finally:
        syncing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await syncing
        sync.close()


def counts(sync: WeightSync) -> dict[str, float]:
    sample = sync.metrics.registry.registry.get_sample_value
    return {
        "handles": sample("relayrl_rollout_versions_loaded_total", {"route": "handles"}) or 0.0,
        "bytes": sample("relayrl_rollout_versions_loaded_total", {"route": "bytes"}) or 0.0,
        "fallbacks": sample("relayrl_rollout_handle_fallbacks_total") or 0.0,
        "fetches": sample("relayrl_rollout_weight_fetch_seconds_count") or 0.0,
        "applies": sample("relayrl_rollout_weight_apply_seconds_count") or 0.0,
    }


@dataclass
class Loaded:
    """A version loaded through a replica: what the engine answered before and after, its number,
    the replica's WeightSync (its counters), and every call the switch made to the engine."""

    before: list[float]
    after: list[float]
    version: int
    sync: WeightSync
    calls: list[tuple[str, Any]]

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]


async def load_through_replica(
    engine: EngineProcess,
    model_dir: Path,
    tmp_path: Path,
    tensors: dict[str, torch.Tensor],
    handles: WeightHandles,
    mode: str = "abort_resume",
    **settings: Any,
) -> Loaded:
    """Publishes ``tensors`` with ``handles`` and lets a replica in ``mode`` load the version; checks
    that the engine then holds it and answers exactly as after the same bytes loaded from a file."""
    async with (
        paramsync_service() as address,
        ParamSyncClient(address) as paramsync,
        SwitchLog(engine.url) as client,
        original_weights_after(client, model_dir),
    ):
        new = int(await client.weight_version()) + 1
        before = await greedy_logprobs(client)
        sync, state = bare_weight_sync(paramsync, client, "r-handles", mode, tmp_path / "weights", new - 1, **settings)
        await publish_and_load(sync, state, paramsync, new, tensors, handles)
        engine_version = await client.weight_version()
        after = await greedy_logprobs(client)
        calls = list(client.calls)
        by_bytes = await logprobs_by_bytes(client, tensors, tmp_path / "bytes")
    assert engine_version == str(new)
    assert after == by_bytes
    return Loaded(before, after, new, sync, calls)


@pytest.mark.parametrize(("count", "mode"), [(3, "abort_resume"), (3, "in_place"), (1, "abort_resume")])
async def test_a_version_shared_by_handle_loads_with_nothing_fetched(
    engine: EngineProcess, tiny_model_dir: Path, tmp_path: Path, file_system_sharing: None, count: int, mode: str
) -> None:
    tensors = new_policy(tiny_model_dir, 1.1)
    buckets, payloads = shared_buckets(tensors, count)
    loaded = await load_through_replica(engine, tiny_model_dir, tmp_path, tensors, handles_here(payloads), mode)
    del buckets  # the engine has copied them

    assert loaded.after != loaded.before, "the version must answer differently for this test to mean anything"
    # Nothing fetched, one apply (every call together), as the route counter says.
    assert counts(loaded.sync) == {"handles": 1, "bytes": 0, "fallbacks": 0, "fetches": 0, "applies": 1}
    switch = loaded.calls
    updates = [body for path, body in switch if path == "/update_weights_from_tensor"]
    assert [body["serialized_named_tensors"] for body in updates] == [[p] for p in payloads]
    # Only the last call sets the version (and flushes, where the bytes route would).
    assert [body.get("weight_version") for body in updates] == [None] * (count - 1) + [str(loaded.version)]
    assert [body["flush_cache"] for body in updates] == [False] * (count - 1) + [mode != "in_place"]
    if count == 1 and mode != "in_place":
        # As a switch by bytes: one call that aborts and applies between two engine steps.
        assert loaded.paths() == ["/update_weights_from_tensor"]
        assert updates[0]["abort_all_requests"] is True
    else:
        # No step may run on a mix of versions: one pause around every call.
        assert loaded.paths() == ["/pause_generation"] + ["/update_weights_from_tensor"] * count + [
            "/continue_generation"
        ]
        assert switch[0][1] == {"mode": "in_place" if mode == "in_place" else "abort"}
        assert not any(body["abort_all_requests"] for body in updates)


@pytest.mark.parametrize("why", ["freed", "other_host", "declined"])
async def test_handles_the_engine_cannot_use_fall_back_to_the_bytes(
    engine: EngineProcess, tiny_model_dir: Path, tmp_path: Path, file_system_sharing: None, why: str
) -> None:
    """Freed: the trainer that shared them restarted and their memory is gone, so the engine
    refuses the first bucket and nothing in it changed. Another host's handles are not tried, nor
    any by a replica set not to (``load_weights_by_handle``: its engine is on another GPU)."""
    tensors = new_policy(tiny_model_dir, 1.1)
    settings = {"load_weights_by_handle": False} if why == "declined" else {}
    if why == "freed":
        handles = handles_here(payloads_of_an_exited_trainer(tiny_model_dir))
    else:
        # Other weights than the bytes: opened by mistake, they would show in what the engine generates.
        _, payloads = shared_buckets(new_policy(tiny_model_dir, 1.3), 2)
        host = socket.gethostname() if why == "declined" else f"{socket.gethostname()}-elsewhere"
        handles = WeightHandles(host, FLATTENED_BUCKET, tuple(payloads))
    loaded = await load_through_replica(engine, tiny_model_dir, tmp_path, tensors, handles, **settings)
    tried = why == "freed"
    assert counts(loaded.sync) == {"handles": 0, "bytes": 1, "fallbacks": int(tried), "fetches": 1, "applies": 1}
    # A refused first bucket is given up under its pause; the bytes then switch as always.
    handle_calls = ["/pause_generation", "/update_weights_from_tensor", "/continue_generation"] if tried else []
    assert loaded.paths() == [*handle_calls, "/update_weights_from_disk"]


async def test_a_bucket_refused_after_others_loaded_loads_the_bytes_before_generation_continues(
    engine: EngineProcess, tiny_model_dir: Path, tmp_path: Path, file_system_sharing: None
) -> None:
    """The engine holds half the version after the first bucket; the bytes must land under the same
    pause, so no step runs on the mix."""
    tensors = new_policy(tiny_model_dir, 1.1)
    buckets, payloads = shared_buckets(tensors, 2)
    handles = handles_here([payloads[0], "%%% not a payload"])
    loaded = await load_through_replica(engine, tiny_model_dir, tmp_path, tensors, handles)
    del buckets
    assert counts(loaded.sync) == {"handles": 0, "bytes": 1, "fallbacks": 1, "fetches": 1, "applies": 1}
    assert loaded.paths() == [
        "/pause_generation",
        "/update_weights_from_tensor",
        "/update_weights_from_tensor",
        "/update_weights_from_disk",
        "/continue_generation",
    ]
