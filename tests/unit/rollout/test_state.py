"""The rules of one replica's state: versions only forward, pause and readiness gate leasing, leases."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.rollout.metrics import RolloutMetrics
from services.rollout.state import ReplicaState


def _state() -> tuple[ReplicaState, RolloutMetrics]:
    metrics = RolloutMetrics()
    return ReplicaState("r-0", metrics), metrics


def _gauge(metrics: RolloutMetrics, name: str) -> float | None:
    return metrics.registry.registry.get_sample_value(f"relayrl_rollout_{name}")


async def test_the_held_version_only_moves_forward_and_raises_the_latest() -> None:
    state, metrics = _state()
    state.hold(3, sync_s=0.5)
    state.hold(2)
    assert (state.held_version, state.latest_version) == (3, 3)
    assert _gauge(metrics, "weight_version") == 3
    assert _gauge(metrics, "weight_update_duration_seconds_count") == 1
    state.note_latest(5)
    state.note_latest(4)
    assert (state.held_version, state.latest_version) == (3, 5)


async def test_an_engine_back_at_an_older_version_is_a_restart_reported_once() -> None:
    state, metrics = _state()
    state.engine_reports(4)
    assert state.held_version == 4 and not state.take_engine_restart()
    state.engine_reports(1)
    assert (state.held_version, state.latest_version) == (1, 4)
    assert _gauge(metrics, "weight_version") == 1
    await asyncio.wait_for(state.engine_restarted(), 1.0)
    assert state.take_engine_restart()
    assert not state.take_engine_restart()


async def test_a_version_change_wakes_a_waiter() -> None:
    state, _ = _state()
    waiter = asyncio.create_task(state.version_changed(timeout_s=10.0))
    await asyncio.sleep(0)
    state.hold(1)
    await asyncio.wait_for(waiter, 1.0)


async def test_leasable_only_with_a_ready_engine_and_no_pause() -> None:
    state, metrics = _state()
    assert not state.leasable()
    state.set_engine_ready(True)
    assert state.leasable() and _gauge(metrics, "engine_ready") == 1
    state.set_paused("retract")
    status = state.status()
    assert not state.leasable() and state.paused and (status.paused, status.pause_mode) == (True, "retract")
    assert not await state.became_leasable(timeout_s=0.01)
    state.set_resumed()
    assert state.leasable() and state.status().pause_mode == ""
    state.set_engine_ready(False)
    assert not state.leasable() and _gauge(metrics, "engine_ready") == 0


async def test_a_lease_is_held_until_its_work_is_done_and_renewed_at_half_time() -> None:
    state, _ = _state()
    now = time.time()
    release = asyncio.Event()
    task = asyncio.create_task(release.wait())
    state.add_lease("l1", task, now + 10.0)  # type: ignore[arg-type]
    assert state.leases_held == 1 and state.lease_tasks() == [task]
    assert state.leases_due(now) == [] and state.leases_due(now + 5.1) == ["l1"]
    assert 5.0 <= state.until_next_renewal(now, default_s=30.0) < 5.1
    state.renewed("l1", now + 20.0, now + 5.0)
    assert state.leases_due(now + 5.1) == []
    release.set()
    await task
    await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    assert state.leases_held == 0 and state.held_lease("l1") is None
    assert state.until_next_renewal(now, default_s=30.0) == 30.0


async def test_status_counts_work_in_flight_pushed_and_failed() -> None:
    state, _ = _state()
    state.change_in_flight(3)
    state.count_pushed(2)
    state.count_error()
    status = state.status()
    assert (status.in_flight, status.total_generated_samples, status.generation_errors) == (3, 2, 1)
    state.change_in_flight(-3)
    assert state.status().in_flight == 0


async def test_training_generation_waits_for_the_last_validation_prompt() -> None:
    state, metrics = _state()
    await asyncio.wait_for(state.training_may_start(), 1.0)
    with state.validating():
        with state.validating():
            assert _gauge(metrics, "validation_prompts") == 2
            waiter = asyncio.create_task(state.training_may_start())
            await asyncio.sleep(0)
        # One validation prompt is still generating: training stays held whatever else runs.
        for _ in range(3):
            await asyncio.sleep(0)
        assert not waiter.done() and _gauge(metrics, "validation_prompts") == 1
    await asyncio.wait_for(waiter, 1.0)
    assert _gauge(metrics, "validation_prompts") == 0
    held = _gauge(metrics, "held_for_validation_seconds_total")
    assert held is not None and held > 0


async def test_a_failed_validation_prompt_still_releases_training() -> None:
    state, _ = _state()
    with pytest.raises(RuntimeError), state.validating():
        raise RuntimeError("engine gone")
    await asyncio.wait_for(state.training_may_start(), 1.0)
