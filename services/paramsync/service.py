"""ParamSync's gRPC front door: each RPC checks its request, calls the core
(:mod:`services.paramsync.core`) and answers; the core's refusals become gRPC statuses through
the one table in :mod:`services.paramsync.errors`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc

from relayrl.v1 import paramsync_pb2 as pb
from relayrl.v1 import paramsync_pb2_grpc as pb_grpc
from services.paramsync.core import Checksums, Chunk, ParamSyncCore
from services.paramsync.errors import status_of
from services.paramsync.manifest import Manifest
from services.paramsync.store import StoredVersion, StoreError, VersionState
from services.paramsync.wire import RawChunk, decode_stream_message, serialize_stream_message

log = logging.getLogger(__name__)

SERVICE_NAME = "relayrl.v1.ParamSync"


def add_to_server(core: ParamSyncCore, server: grpc.aio.Server) -> None:
    """Registers ParamSync like the generated ``add_ParamSyncServicer_to_server``, except that weight
    streams use the hand-framed chunks of :mod:`services.paramsync.wire` (identical bytes, fewer copies)."""
    service = ParamSyncServicer(core)
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
        "AbortUpload": grpc.unary_unary_rpc_method_handler(
            service.AbortUpload,
            request_deserializer=pb.AbortUploadRequest.FromString,
            response_serializer=pb.AbortUploadResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


class ParamSyncServicer(pb_grpc.ParamSyncServicer):
    """ParamSync over gRPC: turns requests into calls on the core and the core's refusals into
    statuses (:func:`~services.paramsync.errors.status_of`)."""

    def __init__(self, core: ParamSyncCore) -> None:
        self.core = core

    async def _abort(self, context: grpc.aio.ServicerContext, err: StoreError) -> None:
        await context.abort(status_of(err), str(err))

    # --- RPCs ---------------------------------------------------------------------------------

    async def Publish(
        self, request_iterator: AsyncIterator[pb.WeightStreamMessage | RawChunk], context: grpc.aio.ServicerContext
    ) -> pb.PublishResponse:
        messages = aiter(request_iterator)
        try:
            first = await asyncio.wait_for(anext(messages), self.core.upload_idle_timeout_s)
        except StopAsyncIteration:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Publish stream was empty; send a manifest first")
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no manifest received")
        if isinstance(first, RawChunk) or not first.HasField("manifest"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first Publish message must be a manifest")
        try:
            manifest = Manifest.from_proto(first.manifest)
        except ValueError as exc:
            self.core.metrics.publish_failures.labels("invalid_manifest").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid manifest: {exc}")
        try:
            stored = self.core.begin_upload(manifest, first.resume_from_bytes)
        except StoreError as err:
            await self._abort(context, err)
        if stored is None:
            return pb.PublishResponse(version=manifest.version, bytes_received=0)
        started, epoch = time.perf_counter(), stored.link_epoch
        try:
            await self.core.receive(stored, _chunks(messages), epoch)
            received = self.core.commit_upload(stored, started)
        except StoreError as err:
            if err.reason == "incomplete" and manifest.is_open:
                # grpc ends the request stream the same way when the connection breaks as when the
                # client stops early (neither cancels the context). A streamed upload's client never
                # stops early on purpose (it aborts instead), so here the link broke: keep it open.
                self.core.link_broke(stored, epoch)
            else:
                self.core.fail_upload(stored, err, epoch)
            await self._abort(context, err)
        except asyncio.CancelledError:  # the link broke while paramsync was waiting on it
            self.core.link_broke(stored, epoch)
            raise
        return pb.PublishResponse(version=stored.version, bytes_received=received)

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WeightStreamMessage | bytes]:
        if request.version < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version must be >= 0, got {request.version}")
        try:
            stored = self.core.store.get(request.version)
        except StoreError as err:
            await self._abort(context, err)
        opened = stored.manifest
        yield pb.WeightStreamMessage(manifest=opened.to_proto())
        # Chunks sit on a fixed grid (multiples of chunk_bytes inside each tensor) so replicas
        # fetching together share one serialized copy of each chunk.
        with stored.reading():
            for index, (spec, start) in enumerate(zip(stored.manifest.tensors, stored.manifest.offsets(), strict=True)):
                for offset in range(0, spec.num_bytes, self.core.chunk_bytes):
                    stop = min(offset + self.core.chunk_bytes, spec.num_bytes)
                    try:
                        await stored.wait_past(start + stop - 1, self.core.upload_idle_timeout_s)
                    except TimeoutError:
                        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"version {stored.version} stalled")
                    if stored.state is VersionState.FAILED:
                        await context.abort(
                            grpc.StatusCode.ABORTED, f"upload of version {stored.version} failed: {stored.error}"
                        )
                    yield stored.serialized_chunk(index, offset, stop)
                    self.core.metrics.bytes_sent.labels("grpc").inc(stop - offset)
            if opened.is_open:
                try:
                    committed = await _completed(stored, self.core.upload_idle_timeout_s)
                except TimeoutError:
                    await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"version {stored.version} stalled")
                if not committed:
                    await context.abort(
                        grpc.StatusCode.ABORTED, f"upload of version {stored.version} failed: {stored.error}"
                    )
                yield pb.WeightStreamMessage(manifest=stored.manifest.to_proto())

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
        async for announcement in self.core.announcements(request.replica_id, request.engine_url, request.held_version):
            yield announcement.to_proto()

    async def ReportVersion(
        self, request: pb.ReportVersionRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportVersionResponse:
        if not request.replica_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "replica_id must be non-empty")
        if request.version < 0 or request.sync_s < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "version and sync_s must be >= 0")
        latest = self.core.report(request.replica_id, request.ok, request.version, request.sync_s, request.error)
        return pb.ReportVersionResponse(latest_version=latest)

    async def ListReplicas(
        self, request: pb.ListReplicasRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListReplicasResponse:
        return pb.ListReplicasResponse(
            latest_version=self.core.store.latest_version, replicas=[r.to_proto() for r in self.core.table.snapshot()]
        )

    async def DataPlane(self, request: pb.DataPlaneRequest, context: grpc.aio.ServicerContext) -> pb.DataPlaneInfo:
        return pb.DataPlaneInfo(data_port=self.core.data_port)

    async def AbortUpload(
        self, request: pb.AbortUploadRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortUploadResponse:
        return pb.AbortUploadResponse(aborted=self.core.abort_upload(request.version, request.reason))


async def _completed(stored: StoredVersion, timeout_s: float) -> bool:
    """Waits for the upload's end (its last bytes may be verified after they were forwarded);
    True when the version was committed."""
    while stored.state is VersionState.UPLOADING:
        await stored.wait_past(stored.manifest.total_bytes, timeout_s)
    return stored.state is VersionState.COMPLETE


async def _chunks(messages: AsyncIterator[pb.WeightStreamMessage | RawChunk]) -> AsyncIterator[Chunk | Checksums]:
    """The chunks and checksums of a Publish stream after its manifest; a second manifest is refused."""
    async for msg in messages:
        if isinstance(msg, RawChunk):
            yield msg
        elif msg.HasField("chunk"):
            yield msg.chunk
        elif msg.HasField("checksums"):
            yield Checksums(msg.checksums.first_tensor, list(msg.checksums.checksums))
        else:
            raise StoreError("bad_message", "only one manifest per upload")
