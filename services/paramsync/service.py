"""The ParamSync gRPC service: accepts uploads, serves fetches, announces versions, keeps the table.

Everything runs on one asyncio loop, so the store and the table need no locks. Long work
(hashing is incremental per chunk; disk writes and broadcasts) runs in the delivery task or in
threads, never inside a request handler, so the trainer's upload is never slowed by replicas.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from relayrl.v1 import paramsync_pb2 as pb
from relayrl.v1 import paramsync_pb2_grpc as pb_grpc
from services.paramsync import safetensors_io
from services.paramsync.endpoints import ReplicaDiscovery, ReplicaEndpoint
from services.paramsync.manifest import Announcement, Manifest
from services.paramsync.metrics import ParamSyncMetrics
from services.paramsync.store import StoredVersion, StoreError, UploadWriter, VersionState, VersionStore
from services.paramsync.table import VersionTable
from services.paramsync.transports.base import WeightTransport
from services.paramsync.wire import RawChunk, decode_stream_message, serialize_stream_message

log = logging.getLogger(__name__)

SERVICE_NAME = "relayrl.v1.ParamSync"


def add_to_server(service: ParamSyncService, server: grpc.aio.Server) -> None:
    """Registers ParamSync like the generated ``add_ParamSyncServicer_to_server``, except that weight
    streams use the hand-framed chunks of :mod:`services.paramsync.wire` (identical bytes, fewer copies)."""
    handlers = {
        "Publish": grpc.stream_unary_rpc_method_handler(
            service.Publish,
            request_deserializer=decode_stream_message,
            response_serializer=pb.PublishResponse.SerializeToString,
        ),
        "Fetch": grpc.unary_stream_rpc_method_handler(
            service.Fetch,
            request_deserializer=pb.FetchRequest.FromString,
            response_serializer=serialize_stream_message,
        ),
        "Subscribe": grpc.unary_stream_rpc_method_handler(
            service.Subscribe,
            request_deserializer=pb.SubscribeRequest.FromString,
            response_serializer=pb.VersionAnnouncement.SerializeToString,
        ),
        "ReportVersion": grpc.unary_unary_rpc_method_handler(
            service.ReportVersion,
            request_deserializer=pb.ReportVersionRequest.FromString,
            response_serializer=pb.ReportVersionResponse.SerializeToString,
        ),
        "ListReplicas": grpc.unary_unary_rpc_method_handler(
            service.ListReplicas,
            request_deserializer=pb.ListReplicasRequest.FromString,
            response_serializer=pb.ListReplicasResponse.SerializeToString,
        ),
        "DataPlane": grpc.unary_unary_rpc_method_handler(
            service.DataPlane,
            request_deserializer=pb.DataPlaneRequest.FromString,
            response_serializer=pb.DataPlaneInfo.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


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


class ParamSyncService(pb_grpc.ParamSyncServicer):
    def __init__(
        self,
        store: VersionStore,
        table: VersionTable,
        transport: WeightTransport,
        metrics: ParamSyncMetrics,
        chunk_bytes: int,
        upload_idle_timeout_s: float,
        store_dir: Path | None = None,
    ) -> None:
        self.store = store
        self.table = table
        self.transport = transport
        self.metrics = metrics
        self.chunk_bytes = chunk_bytes
        self.upload_idle_timeout_s = upload_idle_timeout_s
        self.store_dir = store_dir
        self.announcer = Announcer()
        # Set by the server once the bulk data plane listens (services.paramsync.dataplane).
        self.data_port = 0
        self._delivered: Announcement | None = None
        self._delivery_wanted = asyncio.Event()

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
        """Delivers the latest version whenever one is committed or (push transports) replicas join."""
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
                    announcement = await self.transport.deliver(stored, self.table.endpoints())
            except Exception:
                log.exception("delivering version %d failed", stored.version)
                self.metrics.sync_failures.labels("delivery").inc()
                continue
            if self._delivered is None or announcement.version > self._delivered.version:
                self._delivered = announcement
                if not self.transport.forwards_uploads:
                    self.announcer.announce(announcement)

    async def watch_discovery(self, discovery: ReplicaDiscovery) -> None:
        known: frozenset[ReplicaEndpoint] = frozenset()
        async for current in discovery.watch():
            for gone in {r.replica_id for r in known} - {r.replica_id for r in current}:
                self.table.remove(gone)
            for replica in current - known:
                self.table.ensure(replica.replica_id, replica.engine_url)
            if self.transport.pushes and current - known:
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
        if not self.transport.forwards_uploads:
            return self._delivered
        newest = self.store.uploading or self.store.latest
        return self.transport.announcement(newest) if newest is not None else None

    async def _abort(self, context: grpc.aio.ServicerContext, err: StoreError) -> None:
        await context.abort(err.code, str(err))

    # --- RPCs ---------------------------------------------------------------------------------

    async def Publish(
        self, request_iterator: AsyncIterator[pb.WeightStreamMessage | RawChunk], context: grpc.aio.ServicerContext
    ) -> pb.PublishResponse:
        messages = aiter(request_iterator)
        try:
            first = await asyncio.wait_for(anext(messages), self.upload_idle_timeout_s)
        except StopAsyncIteration:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Publish stream was empty; send a manifest first")
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no manifest received")
        if isinstance(first, RawChunk) or not first.HasField("manifest"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first Publish message must be a manifest")
        try:
            manifest = Manifest.from_proto(first.manifest)
        except ValueError as exc:
            self.metrics.publish_failures.labels("invalid_manifest").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid manifest: {exc}")
        try:
            stored = self.begin_upload(manifest)
        except StoreError as err:
            await self._abort(context, err)
        if stored is None:
            return pb.PublishResponse(version=manifest.version, bytes_received=0)
        started = time.perf_counter()
        try:
            await self._receive(stored, messages)
            self.commit_upload(stored, started)
        except StoreError as err:
            self.fail_upload(stored, err)
            await self._abort(context, err)
        except asyncio.CancelledError:
            self.fail_upload(stored, None)
            raise
        return pb.PublishResponse(version=stored.version, bytes_received=stored.received)

    # --- the upload life cycle, shared by the Publish RPC and the bulk data plane --------------

    def begin_upload(self, manifest: Manifest) -> StoredVersion | None:
        """Opens the upload of ``manifest`` (None: the same bytes are already the latest version)."""
        try:
            stored = self.store.begin(manifest)
        except StoreError as err:
            self.metrics.publish_failures.labels(err.reason).inc()
            raise
        if stored is None:
            log.info("version %d re-published with identical content; nothing to do", manifest.version)
            return None
        if self.transport.forwards_uploads:
            self.announcer.announce(self.transport.announcement(stored))
        return stored

    def fail_upload(self, stored: StoredVersion, err: StoreError | None) -> None:
        """Drops a failed upload (``err`` None: the trainer went away); the previous version stays."""
        if err is None:
            self.store.fail(stored, "the trainer disconnected mid-upload")
            self.metrics.publish_failures.labels("disconnected").inc()
            log.warning("upload of version %d cancelled after %d bytes", stored.version, stored.received)
            return
        self.store.fail(stored, str(err))
        self.metrics.publish_failures.labels(err.reason).inc()
        log.warning("upload of version %d failed: %s", stored.version, err)

    def commit_upload(self, stored: StoredVersion, started: float) -> None:
        """Makes a fully received, verified upload the latest version; StoreError if it was superseded."""
        if stored.state is VersionState.FAILED:  # superseded while its last bytes arrived
            raise StoreError(grpc.StatusCode.ABORTED, "superseded", stored.error)
        self.store.commit(stored)
        self.metrics.versions_published.inc()
        self.metrics.publish_duration.observe(time.perf_counter() - started)
        self._on_committed(stored)
        log.info("version %d committed (%d bytes)", stored.version, stored.received)

    async def _receive(self, stored: StoredVersion, messages: AsyncIterator[pb.WeightStreamMessage | RawChunk]) -> None:
        writer = UploadWriter(stored)
        while True:
            try:
                msg = await asyncio.wait_for(anext(messages), self.upload_idle_timeout_s)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise StoreError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "idle_timeout",
                    f"upload of version {stored.version} sent nothing for {self.upload_idle_timeout_s:.0f}s",
                ) from None
            if stored.state is VersionState.FAILED:
                raise StoreError(grpc.StatusCode.ABORTED, "superseded", stored.error)
            if not isinstance(msg, RawChunk):
                if not msg.HasField("chunk"):
                    raise StoreError(grpc.StatusCode.INVALID_ARGUMENT, "bad_message", "only one manifest per upload")
                msg = msg.chunk
            writer.accept(msg.tensor_name, msg.offset, msg.data)
            self.metrics.bytes_received.inc(len(msg.data))
        writer.finish()

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WeightStreamMessage | bytes]:
        if request.version < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version must be >= 0, got {request.version}")
        try:
            stored = self.store.get(request.version)
        except StoreError as err:
            await self._abort(context, err)
        yield pb.WeightStreamMessage(manifest=stored.manifest.to_proto())
        # Chunks sit on a fixed grid (multiples of chunk_bytes inside each tensor) so replicas
        # fetching together share one serialized copy of each chunk.
        with stored.reading():
            for index, (spec, start) in enumerate(zip(stored.manifest.tensors, stored.manifest.offsets(), strict=True)):
                for offset in range(0, spec.num_bytes, self.chunk_bytes):
                    stop = min(offset + self.chunk_bytes, spec.num_bytes)
                    try:
                        await stored.wait_past(start + stop - 1, self.upload_idle_timeout_s)
                    except TimeoutError:
                        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"version {stored.version} stalled")
                    if stored.state is VersionState.FAILED:
                        await context.abort(
                            grpc.StatusCode.ABORTED, f"upload of version {stored.version} failed: {stored.error}"
                        )
                    yield stored.serialized_chunk(index, offset, stop)
                    self.metrics.bytes_sent.labels("grpc").inc(stop - offset)

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.VersionAnnouncement]:
        if not request.replica_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "replica_id must be non-empty")
        if request.held_version < 0:
            # Recorded in the version table, a negative version would overflow its lag and break ListReplicas.
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"held_version must be >= 0, got {request.held_version}"
            )
        queue = self.announcer.open()
        try:
            self.table.record_subscribed(request.replica_id, request.engine_url, request.held_version)
            if self.transport.pushes and request.engine_url:
                self._delivery_wanted.set()
            current = self.current_announcement()
            if current is not None and current.version > request.held_version:
                yield current.to_proto()
            while True:
                announcement = await queue.get()
                if announcement.version > request.held_version:
                    yield announcement.to_proto()
        finally:
            self.announcer.close(queue)

    async def ReportVersion(
        self, request: pb.ReportVersionRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportVersionResponse:
        if not request.replica_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "replica_id must be non-empty")
        if request.version < 0 or request.sync_s < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "version and sync_s must be >= 0")
        if request.ok:
            self.table.record_success(request.replica_id, request.version, request.sync_s)
        else:
            self.table.record_failure(request.replica_id, "replica_reported", request.error or "unspecified error")
        return pb.ReportVersionResponse(latest_version=self.store.latest_version)

    async def ListReplicas(
        self, request: pb.ListReplicasRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListReplicasResponse:
        return pb.ListReplicasResponse(
            latest_version=self.store.latest_version, replicas=[r.to_proto() for r in self.table.snapshot()]
        )

    async def DataPlane(self, request: pb.DataPlaneRequest, context: grpc.aio.ServicerContext) -> pb.DataPlaneInfo:
        return pb.DataPlaneInfo(data_port=self.data_port)
