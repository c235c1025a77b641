"""Every request a paused or stopping replica holds gets an answer within ``pause_wait_s``.

An operator pause (``relayrl ctl pause --service rollout``) stops leasing, but requests already
in flight used to wait for the resume however long it took: the engine holds what is sent to it
while paused, up to ``engine_timeout_s`` (600 s). Now

- a generation in flight (a leased prompt, an agent episode, a turn of the OpenAI endpoint)
  waits for the resume at most ``pause_wait_s`` after the pause began; then it is cancelled and
  raises :class:`ReplicaPaused`, so a leased prompt goes back to the queue (nothing is lost) and
  an OpenAI request is answered 503 with ``Retry-After``;
- a sample aborted by the pause (``abort`` mode, the default) is resubmitted only once the pause
  is over (:meth:`PauseBound.gate`), so the paused engine holds no request of this replica. In
  ``retract`` and ``in_place`` modes the engine holds them itself; the cancel ends the HTTP call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from services.rollout.generation import GenerationError
from services.rollout.state import ReplicaState

T = TypeVar("T")


class ReplicaPaused(GenerationError):
    """The replica is paused (or stopping) and the request cannot be served now; retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PauseBound:
    def __init__(self, state: ReplicaState, wait_s: float, retry_after_s: int) -> None:
        self.state = state
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s

    def refusal(self) -> ReplicaPaused | None:
        """Why a new request is refused now (paused or stopping), or None when it may start."""
        if self.state.draining:
            return ReplicaPaused("the replica is shutting down; send the request to another one", self.retry_after_s)
        if self.state.paused:
            return ReplicaPaused(
                f"the replica is paused ({self.state.status().pause_mode}) by its operator; retry after resume",
                self.retry_after_s,
            )
        return None

    async def gate(self) -> None:
        """Before an engine submission: waits while the operator's pause lasts (bounded by :meth:`run`)."""
        if self.state.paused:
            await self.state.wait_unpaused()

    async def run(self, work: Awaitable[T]) -> T:
        """``work``'s result; cancels it and raises :class:`ReplicaPaused` once a pause has lasted ``wait_s``."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                if not self.state.paused:
                    # Re-checked at least every second: a pause does not wake this wait.
                    done, _ = await asyncio.wait([task], timeout=1.0)
                else:
                    left = self.wait_s - self.state.paused_for()
                    if left <= 0:
                        raise ReplicaPaused(
                            f"the replica stayed paused for {self.wait_s:g} s (pause_wait_s) with this request"
                            " in flight; retry after resume",
                            self.retry_after_s,
                        )
                    done, _ = await asyncio.wait([task], timeout=min(left, 1.0))
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
