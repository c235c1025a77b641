"""A paused or stopping replica answers every request: new ones are refused at once, one in flight
waits for the resume at most ``pause_wait_s``, and a resumed pause lets it finish."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.rollout.metrics import RolloutMetrics
from services.rollout.pause_bound import PauseBound, ReplicaPaused
from services.rollout.state import ReplicaState


def _bound(wait_s: float = 0.3) -> tuple[ReplicaState, PauseBound]:
    state = ReplicaState("r-0", RolloutMetrics())
    state.set_engine_ready(True)
    return state, PauseBound(state, wait_s, retry_after_s=7)


async def _held(state: ReplicaState, bound: PauseBound, cancelled: list[bool]) -> str:
    """Work that resubmits through the gate, as an aborted sample does, then finishes."""
    try:
        await bound.gate()
        return "done"
    except asyncio.CancelledError:
        cancelled.append(True)
        raise


async def test_a_new_request_is_refused_while_paused_or_stopping_and_served_otherwise() -> None:
    state, bound = _bound()
    assert bound.refusal() is None
    state.set_paused("abort")
    paused = bound.refusal()
    assert isinstance(paused, ReplicaPaused) and "paused (abort)" in str(paused) and paused.retry_after_s == 7
    state.set_resumed()
    state.set_draining()
    stopping = bound.refusal()
    assert stopping is not None and "shutting down" in str(stopping)
    assert not state.leasable(), "a stopping replica leases nothing"


async def test_work_held_by_a_pause_is_cancelled_after_pause_wait_s() -> None:
    state, bound = _bound(wait_s=0.3)
    state.set_paused("abort")
    cancelled: list[bool] = []
    started = time.monotonic()
    with pytest.raises(ReplicaPaused, match="pause_wait_s") as err:
        await bound.run(_held(state, bound, cancelled))
    assert 0.3 <= time.monotonic() - started < 2.0
    assert cancelled == [True] and err.value.retry_after_s == 7


async def test_work_held_by_a_pause_finishes_when_the_pause_ends_in_time() -> None:
    state, bound = _bound(wait_s=5.0)
    state.set_paused("abort")
    cancelled: list[bool] = []
    running = asyncio.create_task(bound.run(_held(state, bound, cancelled)))
    await asyncio.sleep(0.1)
    assert not running.done()
    state.set_resumed()
    assert await asyncio.wait_for(running, 2.0) == "done" and cancelled == []
