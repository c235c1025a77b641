"""Paramsync's core without gRPC: an upload's life, the replicas' announcements and reports."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from services.paramsync.config import ParamSyncSettings
from services.paramsync.core import ParamSyncCore
from services.paramsync.server import build_service
from services.paramsync.store import StoreError, VersionState
from tests.unit.paramsync.test_store import manifest


@dataclass
class _Chunk:
    tensor_name: str
    offset: int
    data: bytes


async def _chunks(*pieces: _Chunk, hang: bool = False):
    for piece in pieces:
        yield piece
    if hang:
        await asyncio.Event().wait()


def _core(**overrides: object) -> ParamSyncCore:
    return build_service(ParamSyncSettings(**overrides))


async def _publish(core: ParamSyncCore, version: int, data: bytes) -> None:
    stored = core.begin_upload(manifest(version, {"w": data}))
    assert stored is not None
    await core.receive(stored, _chunks(_Chunk("w", 0, data)))
    core.commit_upload(stored, time.perf_counter())


async def test_a_received_upload_becomes_the_latest_version_and_is_announced():
    core = _core()
    stream = core.announcements("rollout-0", "", held_version=0)
    await _publish(core, 1, b"abc")
    deliveries = asyncio.create_task(core.run_deliveries())
    try:
        first = await asyncio.wait_for(anext(stream), 5)
    finally:
        deliveries.cancel()
    assert first.version == 1
    assert core.store.latest_version == 1
    assert core.report("rollout-0", True, 1, 0.2, "") == 1
    assert {r.replica_id: r.version for r in core.table.snapshot()} == {"rollout-0": 1}


async def test_a_bad_upload_fails_with_its_reason_and_the_previous_version_stays():
    core = _core()
    await _publish(core, 1, b"abc")
    stored = core.begin_upload(manifest(2, {"w": b"xyz"}))
    with pytest.raises(StoreError) as err:
        await core.receive(stored, _chunks(_Chunk("w", 0, b"xyZ")))
    assert err.value.reason == "checksum"
    core.fail_upload(stored, err.value)
    assert stored.state is VersionState.FAILED
    assert core.store.latest_version == 1


async def test_a_stalled_upload_is_refused_after_the_idle_timeout():
    core = _core(upload_idle_timeout_s=0.2)
    stored = core.begin_upload(manifest(1, {"w": b"abcdef"}))
    with pytest.raises(StoreError) as err:
        await core.receive(stored, _chunks(_Chunk("w", 0, b"abc"), hang=True))
    assert err.value.reason == "idle_timeout"


def test_a_version_not_newer_is_refused_before_any_byte():
    core = _core()
    asyncio.run(_publish(core, 2, b"abc"))
    with pytest.raises(StoreError) as err:
        core.begin_upload(manifest(1, {"w": b"zzz"}))
    assert err.value.reason == "not_newer"
