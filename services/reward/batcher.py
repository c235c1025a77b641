"""Dynamic batching across concurrent requests.

Every sequence of every request joins one queue. A batch starts with the oldest waiting
sequence and takes whatever else arrives within ``max_wait_s`` of it, up to ``max_batch_size``;
while a forward pass runs, the next batch fills up by itself. Forward passes run one at a time
on one thread, the only one that touches the model, so the event loop keeps answering
``/healthz`` and taking requests meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from services.reward.metrics import RewardMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class _Waiting(Generic[T]):
    ids: list[int]
    future: asyncio.Future[T]
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
        self._queue: asyncio.Queue[_Waiting[T]] = asyncio.Queue()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-forward", initializer=thread_setup)

    async def submit(self, sequences: list[list[int]]) -> list[T]:
        """The result of each sequence, in order, once the batches that hold them have run."""
        loop = asyncio.get_running_loop()
        waiting = [_Waiting(ids, loop.create_future()) for ids in sequences]
        for w in waiting:
            self._queue.put_nowait(w)
        self.metrics.pending_items.inc(len(waiting))
        return list(await asyncio.gather(*(w.future for w in waiting)))

    async def run(self) -> None:
        """Forms and runs batches until cancelled."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                batch = await self._next_batch()
                await self._run_batch(loop, batch)
        finally:
            self._thread.shutdown(wait=False, cancel_futures=True)

    async def _next_batch(self) -> list[_Waiting[T]]:
        batch = [await self._queue.get()]
        deadline = time.perf_counter() + self.max_wait_s
        while len(batch) < self.max_batch_size:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        self.metrics.pending_items.dec(len(batch))
        # A client that went away leaves its futures cancelled: nothing to compute for them.
        return [w for w in batch if not w.future.done()]

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
                if not w.future.done():
                    w.future.set_exception(exc)
            return
        self.metrics.forward_passes.inc()
        self.metrics.batch_size.observe(len(batch))
        self.metrics.forward_latency.observe(time.perf_counter() - started)
        for w, result in zip(batch, results, strict=True):
            if not w.future.done():
                w.future.set_result(result)
