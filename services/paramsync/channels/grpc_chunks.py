"""``grpc_chunks``: a version as a stream of chunk messages on the Publish and Fetch RPCs, both
ends: the peer's (:class:`GrpcChunksChannel`: the trainer sends, a replica receives) and
paramsync's (:class:`GrpcChunksServer`, the two RPCs' handlers).

The fallback where paramsync's TCP data plane (:mod:`.tcp`) is not reachable. Chunks are framed
by hand (:mod:`services.paramsync.wire`): byte-for-byte what protobuf produces, fewer copies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

import grpc

from relayrl.v1 import paramsync_pb2 as pb
from services.paramsync.channels.base import ByteChannel, Place, TensorRun, check_digests
from services.paramsync.core import Checksums, Chunk, ParamSyncCore
from services.paramsync.digest import new_hasher
from services.paramsync.errors import ChecksumMismatch, ParamSyncError, stage_deadline_error, status_of
from services.paramsync.manifest import Manifest
from services.paramsync.store import StoreError, VersionState
from services.paramsync.wire import RawChunk, decode_stream_message, encode_chunk, serialize_stream_message


def stream_calls(
    channel: grpc.aio.Channel,
) -> tuple[grpc.aio.StreamUnaryMultiCallable, grpc.aio.UnaryStreamMultiCallable]:
    """The Publish and Fetch calls on ``channel``, with the hand-framed chunk codec."""
    publish = channel.stream_unary(
        "/relayrl.v1.ParamSync/Publish",
        request_serializer=serialize_stream_message,
        response_deserializer=pb.PublishResponse.FromString,
    )
    fetch = channel.unary_stream(
        "/relayrl.v1.ParamSync/Fetch",
        request_serializer=pb.FetchRequest.SerializeToString,
        response_deserializer=decode_stream_message,
    )
    return publish, fetch


# --- the peer's end: a trainer sends, a replica receives --------------------------------------


@dataclass(frozen=True, slots=True)
class GrpcChunksChannel(ByteChannel):
    """The peer's end over ``publish`` and ``fetch`` (see :func:`stream_calls`); ``peer`` names
    paramsync in errors, ``replica_id`` the receiving replica in its table."""

    name = "grpc_chunks"

    publish: grpc.aio.StreamUnaryMultiCallable
    fetch: grpc.aio.UnaryStreamMultiCallable
    peer: str
    chunk_bytes: int
    timeout_s: float
    replica_id: str = ""

    async def send(self, manifest: Manifest, runs: AsyncIterator[TensorRun], resume_from: int = 0) -> int:
        """One attempt of a streamed upload over the Publish RPC; returns the bytes paramsync stored.

        Bounded as on the data plane: it fails when paramsync takes nothing for ``sync_timeout``
        seconds (grpc stops taking messages when paramsync stops reading), not counting the waits
        for the next bucket, which its producer bounds. A deadline on the whole call would count
        the gather as well, and grpc reports one that expires mid-write as INTERNAL.
        """
        loop = asyncio.get_running_loop()
        deadline = asyncio.timeout(self.timeout_s)
        stage, live = "upload start", True
        failed: list[BaseException] = []

        def at(next_stage: str, bounded: bool = True) -> None:
            nonlocal stage
            stage = next_stage
            if live:
                deadline.reschedule(loop.time() + self.timeout_s if bounded else None)

        async def messages() -> AsyncIterator[pb.WeightStreamMessage | bytes]:
            yield pb.WeightStreamMessage(manifest=manifest.to_proto(), resume_from_bytes=resume_from)
            while True:
                at("upload (waiting for the next bucket)", bounded=False)
                try:
                    run = await anext(runs)
                except StopAsyncIteration:
                    break
                except Exception as exc:
                    failed.append(exc)
                    raise
                at("upload")
                yield pb.WeightStreamMessage(
                    checksums=pb.TensorChecksums(first_tensor=run.first_tensor, checksums=run.checksums)
                )
                for chunk in _run_chunks(manifest, run, self.chunk_bytes):
                    yield chunk
                    at("upload")
                # Sent: let go of its bytes before waiting for the next run (see tcp.publish_runs).
                del run
            at("commit")

        try:
            async with deadline:
                return (await self.publish(messages())).bytes_received
        except TimeoutError as exc:
            raise stage_deadline_error(stage, self.peer, manifest.version, self.timeout_s) from exc
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
            # grpc swallows an error of the request iterator and cancels the call: raise the error.
            task = asyncio.current_task()
            if failed and not (task is not None and task.cancelling()):
                raise failed[0] from None
            if isinstance(exc, grpc.aio.AioRpcError) and _write_failed(exc):
                message = f"{stage} of version {manifest.version} (peer: {self.peer}) failed: the link broke mid-write"
                raise ParamSyncError(message, grpc.StatusCode.UNAVAILABLE) from exc
            raise
        finally:
            live = False

    async def receive(self, version: int, place: Place) -> Manifest:
        request = pb.FetchRequest(replica_id=self.replica_id, version=version)
        return await _receive_into(self.fetch(request, timeout=self.timeout_s), place)


def _run_chunks(manifest: Manifest, run: TensorRun, chunk_bytes: int) -> Iterator[bytes]:
    """A run's bytes as encoded chunks; its first part may begin inside its tensor, every other
    part begins at its tensor's start."""
    inside = run.start - manifest.offsets()[run.first_tensor]
    for spec, view in zip(manifest.tensors[run.first_tensor :], run.views, strict=False):
        for offset in range(0, view.nbytes, chunk_bytes):
            yield encode_chunk(spec.name, inside + offset, view[offset : offset + chunk_bytes])
        inside = 0


def _write_failed(err: grpc.aio.AioRpcError) -> bool:
    """grpc's own status for a message it could not write because the connection broke (it says
    INTERNAL, not UNAVAILABLE); a server's INTERNAL carries its own details."""
    return err.code() == grpc.StatusCode.INTERNAL and err.details() == "Internal error from Core"


async def _receive_into(stream: AsyncIterator[pb.WeightStreamMessage | RawChunk], place: Place) -> Manifest:
    """Writes a Fetch stream into the views ``place`` gives, checking order, sizes and every
    checksum; returns the complete manifest (for an open one, the one that follows the bytes)."""
    manifest: Manifest | None = None
    closed: Manifest | None = None
    views: Sequence[memoryview] = []
    digests: list[str] = []
    index, filled, hasher = 0, 0, None
    async for msg in stream:
        if manifest is None:
            if isinstance(msg, RawChunk) or not msg.HasField("manifest"):
                raise ParamSyncError("Fetch stream did not start with a manifest")
            manifest = Manifest.from_proto(msg.manifest)
            # Making a version file claims its memory up front: not on the event loop.
            views = await asyncio.to_thread(place, manifest)
            hasher = new_hasher(manifest.checksum_algorithm)
            continue
        if not isinstance(msg, RawChunk) and msg.HasField("manifest"):
            closed = Manifest.from_proto(msg.manifest)
            continue
        chunk = msg if isinstance(msg, RawChunk) else msg.chunk
        # Zero-byte tensors have no chunk of their own; step over them before matching.
        while index < len(manifest.tensors) and manifest.tensors[index].num_bytes == filled:
            digests.append(hasher.hexdigest())
            index, filled, hasher = index + 1, 0, new_hasher(manifest.checksum_algorithm)
        if index >= len(manifest.tensors) or chunk.tensor_name != manifest.tensors[index].name:
            raise ChecksumMismatch(f"unexpected chunk for {chunk.tensor_name!r} at offset {chunk.offset}")
        spec = manifest.tensors[index]
        end = filled + len(chunk.data)
        if chunk.offset != filled or end > spec.num_bytes:
            raise ChecksumMismatch(f"chunk of {spec.name!r} at offset {chunk.offset} out of order or past its end")
        views[index][filled:end] = chunk.data
        hasher.update(chunk.data)
        filled = end
    if manifest is None:
        raise ParamSyncError("Fetch stream ended before the manifest")
    while index < len(manifest.tensors):
        if filled != manifest.tensors[index].num_bytes:
            raise ChecksumMismatch(
                f"stream ended with {manifest.tensors[index].name!r} at {filled}/{manifest.tensors[index].num_bytes}"
                " bytes"
            )
        digests.append(hasher.hexdigest())
        index, filled, hasher = index + 1, 0, new_hasher(manifest.checksum_algorithm)
    if manifest.is_open:
        if closed is None or closed.layout() != manifest.layout():
            raise ChecksumMismatch(f"version {manifest.version}: the stream ended without its checksums")
        manifest = closed
    return check_digests(manifest, digests)


# --- paramsync's end ----------------------------------------------------------------------------


class GrpcChunksServer:
    """The handlers of the Publish and Fetch RPCs: chunk streams into and out of the core's store."""

    def __init__(self, core: ParamSyncCore) -> None:
        self.core = core

    async def publish(
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
            await context.abort(status_of(err), str(err))
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
            await context.abort(status_of(err), str(err))
        except asyncio.CancelledError:  # the link broke while paramsync was waiting on it
            self.core.link_broke(stored, epoch)
            raise
        return pb.PublishResponse(version=stored.version, bytes_received=received)

    async def fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WeightStreamMessage | bytes]:
        if request.version < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version must be >= 0, got {request.version}")
        try:
            stored = self.core.store.get(request.version)
        except StoreError as err:
            await context.abort(status_of(err), str(err))
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
                    committed = await stored.wait_ended(self.core.upload_idle_timeout_s)
                except TimeoutError:
                    await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"version {stored.version} stalled")
                if not committed:
                    await context.abort(
                        grpc.StatusCode.ABORTED, f"upload of version {stored.version} failed: {stored.error}"
                    )
                yield pb.WeightStreamMessage(manifest=stored.manifest.to_proto())


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
