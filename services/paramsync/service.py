"""ParamSync's gRPC front door: each RPC checks its request, calls the core
(:mod:`services.paramsync.core`) and answers; the core's refusals become gRPC statuses through
the one table in :mod:`services.paramsync.errors`. The weight streams (Publish, Fetch) are served
by the ``grpc_chunks`` channel's end (:mod:`services.paramsync.channels.grpc_chunks`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from relayrl.v1 import paramsync_pb2 as pb
from relayrl.v1 import paramsync_pb2_grpc as pb_grpc
from services.paramsync.channels.grpc_chunks import GrpcChunksServer
from services.paramsync.core import ParamSyncCore
from services.paramsync.wire import decode_stream_message, serialize_stream_message

log = logging.getLogger(__name__)

SERVICE_NAME = "relayrl.v1.ParamSync"


def add_to_server(core: ParamSyncCore, server: grpc.aio.Server) -> None:
    """Registers ParamSync like the generated ``add_ParamSyncServicer_to_server``, except that weight
    streams use the hand-framed chunks of :mod:`services.paramsync.wire` (identical bytes, fewer copies)."""
    service = ParamSyncServicer(core)
    chunks = GrpcChunksServer(core)
    handlers = {
        "Publish": grpc.stream_unary_rpc_method_handler(
            chunks.publish,
            request_deserializer=decode_stream_message,
            response_serializer=pb.PublishResponse.SerializeToString,
        ),
        "Fetch": grpc.unary_stream_rpc_method_handler(
            chunks.fetch,
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
    statuses (:func:`~services.paramsync.errors.status_of`). Publish and Fetch, the chunk streams,
    are :class:`~services.paramsync.channels.grpc_chunks.GrpcChunksServer`'s."""

    def __init__(self, core: ParamSyncCore) -> None:
        self.core = core

    # --- RPCs ---------------------------------------------------------------------------------

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
