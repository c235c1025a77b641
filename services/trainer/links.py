"""The trainer's links to other services, as Protocols the trainer writes for itself, and the
I/O thread that runs them.

The queue's :class:`services.queue.client.QueueClient` and paramsync's
:class:`services.paramsync.client.ParamSyncClient` fit these Protocols; so does any in-process
object with the same coroutines. The training loop is synchronous torch code, so rank 0 runs
one asyncio loop in a background thread (:class:`IoThread`) that hosts these clients and the
HTTP server; the loop calls into it and, for publishing, does not wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from relayrl.schema import Group, PromptSpec

log = logging.getLogger(__name__)

T = TypeVar("T")


class Delivered(Protocol):
    """One delivered trajectory group (``services.queue.client.DeliveredGroup`` has this shape)."""

    entry_id: str
    group: Group
    delivery_count: int
    age_versions: int


class TrajectoryQueue(Protocol):
    """What the feed needs from the queue; failures raise :mod:`services.queue.errors` classes."""

    async def release(self, prompts: list[PromptSpec]) -> int: ...

    async def pull(
        self, consumer: str, current_version: int, max_staleness: int, max_groups: int, block_timeout_s: float = 0.0
    ) -> list[Any]: ...

    async def ack(self, consumer: str, entry_ids: list[str]) -> int: ...

    async def stats(self) -> Any: ...

    async def prompt_stats(self) -> Any: ...


class WeightSink(Protocol):
    async def publish(self, version: int, tensors: Iterable[tuple[str, Any]], trainer_step: int = 0) -> Any: ...

    async def list_replicas(self) -> Any:
        """Anything with ``latest_version``: the newest version the weight service holds."""
        ...


class IoThread:
    """An asyncio loop in a daemon thread; the training thread runs coroutines on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="trainer-io", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Runs ``coro`` on the I/O loop and waits for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


@dataclass(slots=True)
class PublishRecord:
    version: int
    seconds: float
    ok: bool
    error: str = ""


class Publisher:
    """Uploads versions in order in the background; the training loop only pays for the gather.

    Versions are uploaded strictly in the order given (one lock, FIFO), so paramsync never sees
    v+1 before v. A failed upload is logged and counted; the next version still goes out.
    """

    def __init__(self, io: IoThread, sink: WeightSink | None) -> None:
        self._io = io
        self._sink = sink
        self._lock = asyncio.Lock()
        self._pending: list[concurrent.futures.Future[PublishRecord]] = []
        self.records: list[PublishRecord] = []

    def publish(self, version: int, tensors: list[tuple[str, Any]], trainer_step: int) -> None:
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._io.submit(self._upload(version, tensors, trainer_step)))

    async def _upload(self, version: int, tensors: list[tuple[str, Any]], trainer_step: int) -> PublishRecord:
        async with self._lock:
            started = time.perf_counter()
            if self._sink is None:
                record = PublishRecord(version, 0.0, True)
            else:
                try:
                    await self._sink.publish(version, tensors, trainer_step=trainer_step)
                    record = PublishRecord(version, time.perf_counter() - started, True)
                except Exception as exc:  # any failure is reported; training goes on
                    log.error("publishing version %d failed: %s", version, exc)
                    record = PublishRecord(version, time.perf_counter() - started, False, str(exc))
            self.records.append(record)
            return record

    def latest_version(self) -> int:
        """The newest version the sink holds (0 without a sink)."""
        if self._sink is None:
            return 0
        return int(self._io.call(self._sink.list_replicas()).latest_version)

    def drain(self, timeout_s: float = 300.0) -> None:
        """Waits for every upload in flight (at shutdown)."""
        for future in self._pending:
            future.result(timeout_s)
        self._pending.clear()
