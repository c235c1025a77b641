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
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from relayrl import threads
from relayrl.schema import Group, PromptSpec
from services.paramsync.errors import StageDeadline

log = logging.getLogger(__name__)

T = TypeVar("T")

# Reading paramsync's table is on the training thread's way to a publish shared by handle: no
# longer than this (the version then goes as bytes only).
REPLICA_TABLE_TIMEOUT_S = 2.0


class Delivered(Protocol):
    """One delivered trajectory group (``services.queue.client.DeliveredGroup`` has this shape)."""

    entry_id: str
    group: Group
    delivery_count: int
    age_versions: int


class TrajectoryQueue(Protocol):
    """What the feed needs from the queue; failures raise :mod:`services.queue.errors` classes."""

    async def release(self, prompts: list[PromptSpec], release_id: str = "") -> int: ...

    async def pull(
        self,
        consumer: str,
        current_version: int,
        max_staleness: int,
        max_groups: int,
        block_timeout_s: float = 0.0,
        held: Sequence[str] | None = None,
    ) -> list[Any]: ...

    async def ack(self, consumer: str, entry_ids: list[str]) -> int: ...

    async def stats(self) -> Any: ...

    async def prompt_stats(self) -> Any: ...

    async def rollback(self, checkpoint_version: int, resumed_version: int) -> int: ...


class WeightSink(Protocol):
    address: str

    async def publish_streamed(
        self,
        version: int,
        specs: Sequence[Any],
        buckets: AsyncIterator[Sequence[Any]],
        trainer_step: int = 0,
        handles: Any = None,
    ) -> Any:
        """Uploads ``version`` while ``buckets`` still yields its tensors (ParamSyncClient.publish_streamed)."""
        ...

    async def list_replicas(self) -> Any:
        """The version table: ``latest_version`` (the newest version the weight service holds) and
        ``replicas`` (each with ``replica_id`` and the ``version`` it reported)."""
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


class _Abandoned(Exception):
    """The upload side gave up on the hand-off; the gathering side drops what it still gathers."""


class BucketHandoff:
    """Passes buckets from the gathering (training) thread to the upload on the I/O thread.

    A rendezvous: ``put`` returns once the upload took the bucket, and the upload takes the next
    one only after sending the previous. So at most two buckets are alive on rank 0, the one
    being sent and the one just gathered, and training waits only when the upload is more than
    a bucket behind. Each wait has a deadline whose StageDeadline names the stage, the peer and
    the version; after a failure on either side the other side stops waiting.
    """

    def __init__(self, version: int, peer: str, timeout_s: float) -> None:
        self.version, self.peer, self.timeout_s = version, peer, timeout_s
        self._cond = threading.Condition()
        self._slot: list[Any] | None = None
        self._ended = False
        self._failed: BaseException | None = None

    def put(self, bucket: list[Any]) -> None:
        """Hands ``bucket`` over and waits until the upload took it (training thread)."""
        with self._cond:
            if self._failed is not None:
                return
            self._slot = bucket
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._slot is None or self._failed is not None, self.timeout_s):
                self._fail(StageDeadline("handoff", self.peer, self.version, self.timeout_s))
                log.error("%s; the rest of version %d is gathered and dropped", self._failed, self.version)

    def end(self) -> None:
        """No more buckets (training thread)."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """The upload failed: later puts return at once and their buckets are dropped."""
        with self._cond:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self._failed = self._failed or exc
        self._slot = None
        self._cond.notify_all()

    def _take(self) -> list[Any] | None:
        with self._cond:
            ready = self._cond.wait_for(
                lambda: self._slot is not None or self._ended or self._failed is not None, self.timeout_s
            )
            if self._failed is not None:
                raise self._failed
            if not ready:
                self._fail(StageDeadline("gather", "the trainer's ranks", self.version, self.timeout_s))
                raise self._failed  # type: ignore[misc]
            bucket, self._slot = self._slot, None
            self._cond.notify_all()
            return bucket

    async def buckets(self) -> AsyncIterator[list[Any]]:
        """The buckets as they come (I/O thread); StageDeadline if the gather stalls."""
        # relayrl.threads: asyncio.to_thread's futures would keep the bucket a moment after it is sent.
        while (bucket := await threads.to_thread(self._take)) is not None:
            yield bucket
            del bucket  # sent: drop it before taking the next, so at most two are alive


class Publisher:
    """Uploads versions in order in the background; the training loop pays for the gather only.

    Versions are uploaded strictly in the order given (one lock, FIFO), so paramsync never sees
    v+1 before v. A failed upload is logged and counted; the next version still goes out.
    """

    def __init__(self, io: IoThread, sink: WeightSink | None, stage_timeout_s: float = 300.0) -> None:
        self._io = io
        self._sink = sink
        self.stage_timeout_s = stage_timeout_s
        self._lock = asyncio.Lock()
        self._pending: list[concurrent.futures.Future[PublishRecord]] = []
        self.records: list[PublishRecord] = []

    def begin_streamed(
        self, version: int, specs: Sequence[Any], trainer_step: int, handles: Any = None
    ) -> BucketHandoff | None:
        """Starts the upload of ``version`` fed bucket by bucket through the returned hand-off
        (None without a sink: nothing to feed), with the version's ``handles`` if it is also shared by handle."""
        if self._sink is None:
            self.records.append(PublishRecord(version, 0.0, True))
            return None
        handoff = BucketHandoff(version, f"paramsync {self._sink.address}", self.stage_timeout_s)
        self._pending = [f for f in self._pending if not f.done()]
        upload = self._upload_streamed(version, specs, handoff, trainer_step, handles)
        self._pending.append(self._io.submit(upload))
        return handoff

    async def _upload_streamed(
        self, version: int, specs: Sequence[Any], handoff: BucketHandoff, trainer_step: int, handles: Any
    ) -> PublishRecord:
        assert self._sink is not None
        try:
            return await self._record(
                version, self._sink.publish_streamed(version, specs, handoff.buckets(), trainer_step, handles)
            )
        finally:
            handoff.fail(RuntimeError(f"the upload of version {version} ended"))

    async def _record(self, version: int, upload: Coroutine[Any, Any, Any]) -> PublishRecord:
        async with self._lock:
            started = time.perf_counter()
            try:
                await upload
                record = PublishRecord(version, time.perf_counter() - started, True)
            except Exception as exc:  # any failure is reported; training goes on
                log.error("publishing version %d failed: %s", version, exc)
                record = PublishRecord(version, time.perf_counter() - started, False, str(exc))
            self.records.append(record)
            return record

    def last_upload_s(self) -> float | None:
        """Seconds the latest finished upload took (from the start of its gather), if any finished."""
        return self.records[-1].seconds if self.records else None

    def replica_table(self, timeout_s: float = REPLICA_TABLE_TIMEOUT_S) -> Any:
        """Paramsync's version table, or None without a sink or when it does not come at once."""
        if self._sink is None:
            return None
        try:
            return self._io.call(self._sink.list_replicas(), timeout_s)
        except Exception as exc:
            log.warning("could not read paramsync's version table: %r", exc)
            return None

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
