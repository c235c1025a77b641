"""Dynamic batching across concurrent requests.

Every sequence of every request joins one queue. A batch starts with the oldest waiting
sequence and takes whatever else arrives within ``max_wait_s`` of that sequence's arrival, up to
``max_batch_size``; while a forward pass runs, the next batch fills up by itself, and a sequence
that already waited out ``max_wait_s`` behind a forward pass goes into the next one at once.
Forward passes run one at a time on one thread, the only one that touches the model, so the
event loop keeps answering ``/healthz`` and taking requests meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from services.reward.metrics import RewardMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class _Request(Generic[T]):
    """One ``submit``: its future is resolved once, when the last of its sequences is scored."""

    future: asyncio.Future[list[T]]
    results: list[T | None]
    missing: int

    def deliver(self, index: int, result: T) -> None:
        self.results[index] = result
        self.missing -= 1
        if not self.missing and not self.future.done():
            self.future.set_result(self.results)  # type: ignore[arg-type]


@dataclass
class _Waiting(Generic[T]):
    ids: list[int]
    request: _Request[T]
    index: int
    since: float = field(default_factory=time.perf_counter)


class DynamicBatcher(Generic[T]):
    def __init__(
        self,
        forward: Callable[[list[list[int]]], list[T]],
        max_batch_size: int,
        max_wait_s: float,
        metrics: RewardMetrics,
        thread_setup: Callable[[], None] | None = None,
    ) -> None:
        self.forward = forward
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.metrics = metrics
        # A deque and one event rather than an asyncio.Queue: a batch of 32 would otherwise cost
        # a wait_for task per sequence, which at the tiny RM's speed is more than the forward pass.
        self._queue: deque[_Waiting[T]] = deque()
        self._arrived = asyncio.Event()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-forward", initializer=thread_setup)

    async def submit(self, sequences: list[list[int]]) -> list[T]:
        """The result of each sequence, in order, once the batches that hold them have run."""
        if not sequences:
            return []
        future: asyncio.Future[list[T]] = asyncio.get_running_loop().create_future()
        request = _Request(future, [None] * len(sequences), len(sequences))
        now = time.perf_counter()
        self._queue.extend(_Waiting(ids, request, i, now) for i, ids in enumerate(sequences))
        self.metrics.pending_items.inc(len(sequences))
        self._arrived.set()
        return await request.future

    async def run(self) -> None:
        """Forms and runs batches until cancelled."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                batch = await self._next_batch(loop)
                await self._run_batch(loop, batch)
        finally:
            self._thread.shutdown(wait=False, cancel_futures=True)

    async def _next_batch(self, loop: asyncio.AbstractEventLoop) -> list[_Waiting[T]]:
        while not self._queue:
            self._arrived.clear()
            await self._arrived.wait()
        deadline = self._queue[0].since + self.max_wait_s
        while len(self._queue) < self.max_batch_size:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            self._arrived.clear()
            waker = loop.call_later(remaining, self._arrived.set)
            await self._arrived.wait()
            waker.cancel()
        taken = min(len(self._queue), self.max_batch_size)
        batch = [self._queue.popleft() for _ in range(taken)]
        self.metrics.pending_items.dec(taken)
        # A client that went away leaves its future cancelled: nothing to compute for it.
        return [w for w in batch if not w.request.future.done()]

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, batch: list[_Waiting[T]]) -> None:
        if not batch:
            return
        started = time.perf_counter()
        for w in batch:
            self.metrics.queue_wait.observe(started - w.since)
        try:
            results = await loop.run_in_executor(self._thread, self.forward, [w.ids for w in batch])
        except Exception as exc:
            log.exception("forward pass over %d sequences failed", len(batch))
            for w in batch:
                if not w.request.future.done():
                    w.request.future.set_exception(exc)
            return
        self.metrics.forward_passes.inc()
        self.metrics.batch_size.observe(len(batch))
        self.metrics.forward_latency.observe(time.perf_counter() - started)
        for w, result in zip(batch, results, strict=True):
            w.request.deliver(w.index, result)
