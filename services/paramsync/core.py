"""Paramsync's core: the upload life cycle, the versions held, the replicas' table, deliveries
and announcements. It knows nothing of gRPC: it raises :class:`StoreError` (mapped to a status in
:mod:`services.paramsync.errors`), and the gRPC servicer (:mod:`services.paramsync.service`) and
the bulk data plane (:mod:`services.paramsync.channels.tcp`) are its two front doors.

Everything runs on one asyncio loop, so the store and the table need no locks. Long work
(hashing is incremental per chunk; disk writes and broadcasts) runs in the delivery task or in
threads, never inside a request handler, so the trainer's upload is never slowed by replicas.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from services.paramsync import safetensors_io
from services.paramsync.delivery.base import Delivery
from services.paramsync.endpoints import ReplicaDiscovery, ReplicaEndpoint
from services.paramsync.manifest import Announcement, Manifest
from services.paramsync.metrics import ParamSyncMetrics
from services.paramsync.store import StoredVersion, StoreError, VersionState, VersionStore
from services.paramsync.table import VersionTable

log = logging.getLogger(__name__)


class Chunk(Protocol):
    """A piece of one tensor's bytes, as both the gRPC stream and the wire codec carry it."""

    tensor_name: str
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Checksums:
    """The checksums of tensors ``first_tensor, ...`` of a streamed upload (TensorChecksums)."""

    first_tensor: int
    checksums: list[str]


def check_link(stored: StoredVersion, epoch: int) -> None:
    """Raises StoreError("superseded") once link ``epoch`` no longer owns the upload."""
    if stored.state is VersionState.FAILED:
        raise StoreError("superseded", stored.error)
    if stored.link_epoch != epoch:
        raise StoreError("superseded", f"upload of version {stored.version} resumed over a newer link")


class Announcer:
    """Fans announcements out to every open Subscribe stream."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[Announcement]] = set()

    def open(self) -> asyncio.Queue[Announcement]:
        queue: asyncio.Queue[Announcement] = asyncio.Queue()
        self._queues.add(queue)
        return queue

    def close(self, queue: asyncio.Queue[Announcement]) -> None:
        self._queues.discard(queue)

    def announce(self, announcement: Announcement) -> None:
        for queue in self._queues:
            queue.put_nowait(announcement)


@dataclass(eq=False)
class ParamSyncCore:
    store: VersionStore
    table: VersionTable
    delivery: Delivery
    metrics: ParamSyncMetrics
    chunk_bytes: int
    upload_idle_timeout_s: float
    # How long an upload whose link broke stays open for the trainer to resume it.
    resume_window_s: float = 10.0
    store_dir: Path | None = None
    announcer: Announcer = field(default_factory=lambda: Announcer(), init=False)
    # Set by the server once the bulk data plane listens (services.paramsync.channels.tcp).
    data_port: int = field(default=0, init=False)
    _delivered: Announcement | None = field(default=None, init=False)
    _delivery_wanted: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    # --- background work ----------------------------------------------------------------------

    def restore_from_disk(self) -> None:
        """Loads the newest readable version under ``store_dir`` (start-up only)."""
        if self.store_dir is None:
            return
        for version in reversed(safetensors_io.list_versions(self.store_dir)):
            try:
                stored = safetensors_io.read_version(safetensors_io.version_dir(self.store_dir, version))
            except (OSError, ValueError, KeyError) as exc:
                log.warning("skipping stored version %d: %s", version, exc)
                continue
            self.store.restore(stored)
            self._on_committed(stored)
            log.info("restored version %d from %s", version, self.store_dir)
            return

    async def run_deliveries(self) -> None:
        """Delivers the latest version whenever one is committed or (push delivery) replicas join."""
        while True:
            await self._delivery_wanted.wait()
            self._delivery_wanted.clear()
            stored = self.store.latest
            if stored is None:
                continue
            try:
                with stored.reading():
                    if self.store_dir is not None:
                        await asyncio.to_thread(safetensors_io.write_version, stored, self.store_dir)
                        await asyncio.to_thread(safetensors_io.prune, self.store_dir, self.store.keep_versions)
                    announcement = await self.delivery.deliver(stored, self.table.endpoints())
            except Exception:
                log.exception("delivering version %d failed", stored.version)
                self.metrics.sync_failures.labels("delivery").inc()
                continue
            if self._delivered is None or announcement.version > self._delivered.version:
                self._delivered = announcement
                if not self.delivery.forwards_uploads:
                    self.announcer.announce(announcement)

    async def watch_discovery(self, discovery: ReplicaDiscovery) -> None:
        known: frozenset[ReplicaEndpoint] = frozenset()
        async for current in discovery.watch():
            for gone in {r.replica_id for r in known} - {r.replica_id for r in current}:
                self.table.remove(gone)
            for replica in current - known:
                self.table.ensure(replica.replica_id, replica.engine_url)
            if self.delivery.pushes and current - known:
                self._delivery_wanted.set()
            known = current

    async def watch_deadlines(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            for replica_id in self.table.check_deadlines():
                log.warning("replica %s is lagging: no report of version %d", replica_id, self.table.latest)

    # --- helpers ------------------------------------------------------------------------------

    def _on_committed(self, stored: StoredVersion) -> None:
        self.metrics.latest_version.set(stored.version)
        self.table.set_latest(stored.version)
        self._delivery_wanted.set()

    def current_announcement(self) -> Announcement | None:
        """What a new subscriber is told at once: the newest version it can start loading now."""
        if not self.delivery.forwards_uploads:
            return self._delivered
        uploading = self.store.uploading
        # An upload shared by handle is announced once committed (begin_upload).
        newest = uploading if uploading is not None and uploading.handles is None else self.store.latest
        return self.delivery.announcement(newest) if newest is not None else None

    # --- the upload life cycle, shared by the Publish RPC and the bulk data plane --------------

    def begin_upload(self, manifest: Manifest, resume_from: int = 0) -> StoredVersion | None:
        """Opens the upload of ``manifest``, or resumes its open upload from byte ``resume_from``
        (None: the same bytes are already the latest version).

        A version the trainer also shares by handle is announced once committed, not as its upload
        begins: the handles' memory is only whole once every byte has left the trainer, and a
        replica on the trainer's host then needs no bytes at all."""
        handles = manifest.handles
        manifest = dataclasses.replace(manifest, handles=None)
        try:
            stored = self.store.begin(manifest, resume_from)
        except StoreError as err:
            self.metrics.publish_failures.labels(err.reason).inc()
            raise
        if stored is None:
            log.info("version %d re-published with identical content; nothing to do", manifest.version)
            return None
        stored.link_epoch += 1
        stored.handles = handles
        if stored.republish_of is None and resume_from == 0 and self.delivery.forwards_uploads and handles is None:
            self.announcer.announce(self.delivery.announcement(stored))
        if resume_from:
            log.info("upload of version %d resumed at byte %d", manifest.version, resume_from)
        return stored

    def fail_upload(self, stored: StoredVersion, err: StoreError | None, epoch: int | None = None) -> None:
        """Drops a failed upload (``err`` None: the trainer went away); the previous version stays.
        With ``epoch``, only while no newer link resumed it."""
        if stored.state is not VersionState.UPLOADING or (epoch is not None and stored.link_epoch != epoch):
            return
        if err is None:
            self.store.fail(stored, "the trainer disconnected mid-upload")
            self.metrics.publish_failures.labels("disconnected").inc()
            log.warning("upload of version %d cancelled after %d bytes", stored.version, stored.received)
            return
        self.store.fail(stored, str(err))
        self.metrics.publish_failures.labels(err.reason).inc()
        log.warning("upload of version %d failed: %s", stored.version, err)

    def link_broke(self, stored: StoredVersion, epoch: int) -> None:
        """The trainer's link ``epoch`` broke mid-upload: keep the upload open for ``resume_window_s``
        so a retry can resume it, then drop it as disconnected. Fetches of it wait meanwhile."""
        if stored.link_epoch != epoch:
            return  # already resumed over a newer link
        if stored.republish_of is not None or stored.state is not VersionState.UPLOADING:
            self.fail_upload(stored, None)
            return
        stored.link_epoch += 1
        epoch = stored.link_epoch
        log.warning(
            "link to the trainer broke during the upload of version %d after %d bytes; open %.0fs for a resume",
            stored.version,
            stored.received,
            self.resume_window_s,
        )

        def drop_unless_resumed() -> None:
            if stored.link_epoch == epoch:
                self.fail_upload(stored, None)

        asyncio.get_running_loop().call_later(self.resume_window_s, drop_unless_resumed)

    def abort_upload(self, version: int, reason: str) -> bool:
        """Drops the open upload of ``version`` at once (the trainer gave up on it)."""
        stored = self.store.uploading
        if stored is None or stored.version != version:
            return False
        self.store.fail(stored, f"aborted by the trainer: {reason or 'no reason given'}")
        self.metrics.publish_failures.labels("aborted").inc()
        log.warning("upload of version %d aborted by the trainer: %s", version, reason)
        return True

    def commit_upload(self, stored: StoredVersion, started: float) -> int:
        """Makes a fully received, verified upload the latest version and returns the bytes stored
        (0 for a re-publish of the latest version's bytes); StoreError if it was superseded."""
        if stored.state is VersionState.FAILED:  # superseded while its last bytes arrived
            raise StoreError("superseded", stored.error)
        assert stored.writer is not None
        manifest = stored.writer.finish()
        if stored.republish_of is not None:
            log.info("version %d re-published with identical content; nothing to do", stored.version)
            stored.writer = None
            return 0
        self.store.commit(stored, manifest)
        self.metrics.versions_published.inc()
        self.metrics.publish_duration.observe(time.perf_counter() - started)
        self._on_committed(stored)
        if stored.handles is not None and self.delivery.forwards_uploads:
            # Not announced at its start (begin_upload): now, not after the delivery's disk copy.
            self.announcer.announce(self.delivery.announcement(stored))
        log.info("version %d committed (%d bytes)", stored.version, stored.received)
        return stored.received

    async def receive(
        self, stored: StoredVersion, messages: AsyncIterator[Chunk | Checksums], epoch: int | None = None
    ) -> None:
        """Writes and checks ``messages`` of link ``epoch`` (default: the current one) into the upload
        until they end; StoreError on a stall, a superseded upload or bytes that do not fit the manifest."""
        epoch = stored.link_epoch if epoch is None else epoch
        writer = stored.writer
        assert writer is not None
        while True:
            try:
                msg = await asyncio.wait_for(anext(messages), self.upload_idle_timeout_s)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise StoreError(
                    "idle_timeout",
                    f"upload of version {stored.version} sent nothing for {self.upload_idle_timeout_s:.0f}s",
                ) from None
            check_link(stored, epoch)
            if isinstance(msg, Checksums):
                writer.add_checksums(msg.first_tensor, msg.checksums)
                writer.begin_run()
                continue
            writer.accept(msg.tensor_name, msg.offset, msg.data)
            self.metrics.bytes_received.inc(len(msg.data))

    # --- replicas ---------------------------------------------------------------------------

    async def announcements(self, replica_id: str, engine_url: str, held_version: int) -> AsyncIterator[Announcement]:
        """Every version newer than ``held_version`` this replica should load, from now on: the
        current one at once, then each announced one. The replica joins the table first."""
        queue = self.announcer.open()
        try:
            self.table.record_subscribed(replica_id, engine_url, held_version)
            if self.delivery.pushes and engine_url:
                self._delivery_wanted.set()
            current = self.current_announcement()
            if current is not None and current.version > held_version:
                yield current
            while True:
                announcement = await queue.get()
                if announcement.version > held_version:
                    yield announcement
        finally:
            self.announcer.close(queue)

    def report(self, replica_id: str, ok: bool, version: int, sync_s: float, error: str) -> int:
        """Records a replica's load result; returns the latest version."""
        if ok:
            self.table.record_success(replica_id, version, sync_s)
            self.store.release_mappings(replica_id, version)
        else:
            self.table.record_failure(replica_id, "replica_reported", error or "unspecified error")
        return self.store.latest_version
