"""Blocking work run off the event loop, keeping nothing of it once it returns.

``asyncio.to_thread`` keeps a call's arguments in the pool's work item, and its result in the
futures that carry it back, for a moment after the awaiting coroutine has resumed: until the pool's
worker drops its work item and the loop has turned once more. Here 1 in 5 calls still held their
arguments and every call still held its result when the await returned; on a busy machine the
worker can take much longer. Where memory is bounded by letting go of buffers at the right time (a
publish keeps a few buckets of the weights alive, a hand-off passes them on one at a time), that
moment can hold a bucket too many.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def to_thread(call: Callable[..., T], *args: Any) -> T:
    """``asyncio.to_thread(call, *args)`` whose thread and futures hold neither ``args`` nor the result
    once it returns: both travel in boxes emptied on the way."""
    given: list[tuple[Any, ...]] = [args]
    del args
    result: list[T] = []

    def run() -> None:
        result.append(call(*given.pop()))

    await asyncio.to_thread(run)
    return result.pop()
