"""The bulk data plane: Publish and Fetch over plain TCP, the weight bytes unframed.

Python gRPC moves one hop at about 1.5 GB/s on the CI machine and every chunk crosses the
Python boundary; a version must cross two hops (trainer → paramsync → replica). Here the bytes of
an upload go from the socket straight into the version's memory (``recv_into``) and are hashed
where they land; a fetch sends slices of that memory. Socket calls run in threads, so the upload
and every fetch use their own core where there is one. (``sendfile`` from a memory file was
measured too: on loopback it cost more CPU than ``sendall``, 0.30 s against 0.21 s per 512 MiB.)

The protocol is described with ``BulkRequest`` in ``paramsync.proto``; the rules (newer only,
checksums, the previous version kept on failure, forwarding while uploading) are those of the
Publish and Fetch RPCs, through the same core (:class:`~services.paramsync.core.ParamSyncCore`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import grpc

from relayrl.v1 import paramsync_pb2 as pb
from services.paramsync.core import ParamSyncCore, check_link
from services.paramsync.dataplane.frames import FrameError, frame, recv_frame
from services.paramsync.errors import status_of
from services.paramsync.manifest import Manifest
from services.paramsync.store import StoredVersion, StoreError, UploadWriter, VersionState

log = logging.getLogger(__name__)
T = TypeVar("T")

# Bytes received (and then forwarded) per step: large enough that per-step overhead vanishes,
# small enough that replicas get each piece while a big tensor is still arriving.
RECV_BYTES = 4 * 1024 * 1024
# Bytes handed to one sendall.
SEND_BYTES = 64 * 1024 * 1024
# Transfers running at once; each holds a thread only while it is inside a socket call.
MAX_TRANSFER_THREADS = 64


def _reply(code: grpc.StatusCode, message: str = "") -> pb.BulkReply:
    return pb.BulkReply(code=code.value[0], message=message)


class DataPlaneServer:
    """Accepts on the asyncio loop; every socket call runs in a thread.

    The store and the version table stay on the loop (no locks); only the byte moving leaves it,
    so an upload and the fetches it feeds run on different cores instead of sharing the loop's.
    While a version is still arriving, at most ``forward_streams`` fetches are fed from it as
    pieces land; the others start once it is complete, from memory at full speed. Every stream
    fed during the upload competes with it for CPU and memory bandwidth: with 4 replicas on the
    2-core CI machine, feeding all of them made the trainer's upload 1.3–1.4× as long as with
    one replica, and the last replica got the version no sooner (0.95–0.97 s either way).
    """

    def __init__(self, core: ParamSyncCore, forward_streams: int = 1) -> None:
        self.core = core
        self.forward_streams = forward_streams
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._connections: dict[asyncio.Task[None], socket.socket] = {}
        self._threads = ThreadPoolExecutor(MAX_TRANSFER_THREADS, thread_name_prefix="paramsync-dataplane")
        # Fetches being fed from an upload still in progress (see forward_streams).
        self._forwarding = 0

    async def start(self, host: str, port: int) -> int:
        """Listens on ``host:port`` (0: any free port) and returns the bound port."""
        listener = socket.create_server((host, port), backlog=128)
        listener.setblocking(False)
        self._listener = listener
        self._accepting = asyncio.create_task(self._accept_loop(listener), name="paramsync-dataplane-accept")
        self.core.data_port = listener.getsockname()[1]
        return self.core.data_port

    async def stop(self) -> None:
        self.core.data_port = 0
        if self._accepting is not None:
            self._accepting.cancel()
        for task, conn in list(self._connections.items()):
            # Wakes a thread blocked in recv or send on this connection.
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            task.cancel()
        tasks = [t for t in (self._accepting, *self._connections) if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, peer = await loop.sock_accept(listener)
            conn.setblocking(True)
            conn.settimeout(self.core.upload_idle_timeout_s)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = asyncio.create_task(self._serve(conn, peer), name=f"paramsync-dataplane-{peer}")
            self._connections[task] = conn
            task.add_done_callback(self._connections.pop)

    async def _io(self, call: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, call, *args)

    async def _send(self, conn: socket.socket, reply: pb.BulkReply) -> None:
        await self._io(conn.sendall, frame(reply))

    async def _serve(self, conn: socket.socket, peer: object) -> None:
        with conn:
            try:
                request = await self._io(recv_frame, conn, pb.BulkRequest)
                operation = request.WhichOneof("operation")
                if operation == "publish":
                    await self._publish(conn, request.publish, request.resume_from_bytes)
                elif operation == "fetch":
                    await self._fetch(conn, request.fetch)
                else:
                    await self._send(conn, _reply(grpc.StatusCode.INVALID_ARGUMENT, "BulkRequest names no operation"))
            except FrameError as exc:
                with contextlib.suppress(OSError):
                    await self._send(conn, _reply(grpc.StatusCode.INVALID_ARGUMENT, str(exc)))
            except OSError as exc:  # includes timeouts and peers that went away
                log.info("data plane connection from %s ended: %s", peer, exc or type(exc).__name__)

    # --- publish ------------------------------------------------------------------------------

    async def _publish(self, conn: socket.socket, proto: pb.WeightManifest, resume_from: int) -> None:
        try:
            manifest = Manifest.from_proto(proto)
        except ValueError as exc:
            self.core.metrics.publish_failures.labels("invalid_manifest").inc()
            await self._send(conn, _reply(grpc.StatusCode.INVALID_ARGUMENT, f"invalid manifest: {exc}"))
            return
        try:
            stored = self.core.begin_upload(manifest, resume_from)
        except StoreError as err:
            await self._send(conn, _reply(status_of(err), str(err)))
            return
        if stored is None:
            await self._send(conn, _reply(grpc.StatusCode.ALREADY_EXISTS, "the latest version has these bytes"))
            return
        started, epoch = time.perf_counter(), stored.link_epoch
        try:
            await self._send(conn, _reply(grpc.StatusCode.OK))
            await self._receive(conn, stored, epoch)
            received = self.core.commit_upload(stored, started)
        except StoreError as err:
            # A connection closed midway is a link that broke (or a trainer that died): either the
            # trainer resumes within the window or the upload is dropped.
            if err.reason == "incomplete":
                self.core.link_broke(stored, epoch)
            else:
                self.core.fail_upload(stored, err, epoch)
            with contextlib.suppress(OSError):
                await self._send(conn, _reply(status_of(err), str(err)))
            return
        except (OSError, asyncio.CancelledError):
            self.core.link_broke(stored, epoch)
            raise
        await self._send(conn, pb.BulkReply(bytes_received=received))

    async def _receive(self, conn: socket.socket, stored: StoredVersion, epoch: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            await self._io(self._receive_blocking, conn, stored, epoch, loop)
        except TimeoutError:
            raise StoreError(
                "idle_timeout",
                f"upload of version {stored.version} stalled for {self.core.upload_idle_timeout_s:.0f}s",
            ) from None
        except FrameError as exc:
            raise StoreError("bad_message", f"upload of version {stored.version}: {exc}") from None

    def _receive_blocking(
        self, conn: socket.socket, stored: StoredVersion, epoch: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        """Receives and hashes the whole upload in this thread, posting progress to the loop.

        One thread for the whole stream, not one hand-off per piece: a round trip through the
        loop for every MiB cost a third of the throughput. With an open manifest the bytes come in
        runs of tensors, each after a framed TensorChecksums.
        """
        writer = stored.writer
        assert writer is not None
        manifest = stored.manifest
        offsets = [*manifest.offsets(), manifest.total_bytes]
        position = writer.position
        while position < manifest.total_bytes:
            end = manifest.total_bytes
            if manifest.is_open:
                run = recv_frame(conn, pb.TensorChecksums)
                first, count = run.first_tensor, len(run.checksums)
                if not 0 <= first < len(manifest.tensors) or offsets[first] != position or count == 0:
                    raise StoreError(
                        "bad_message",
                        f"version {stored.version}: checksums for tensor {first} where byte {position} is due",
                    )
                writer.add_checksums(first, list(run.checksums))
                end = offsets[min(first + count, len(manifest.tensors))]
            position = self._receive_run(conn, stored, epoch, writer, loop, position, end)

    def _receive_run(
        self,
        conn: socket.socket,
        stored: StoredVersion,
        epoch: int,
        writer: UploadWriter,
        loop: asyncio.AbstractEventLoop,
        position: int,
        end: int,
    ) -> int:
        data = stored.data
        while position < end:
            check_link(stored, epoch)
            received = conn.recv_into(data[position : min(end, position + RECV_BYTES)], 0, socket.MSG_WAITALL)
            if received == 0:  # the trainer closed the connection (or died): as a gRPC stream ending early
                raise StoreError(
                    "incomplete",
                    f"version {stored.version}: upload ended after {position} of {stored.manifest.total_bytes} bytes",
                )
            check_link(stored, epoch)
            writer.check_in_place(position, received)
            position += received
            loop.call_soon_threadsafe(self._progress, stored, position, received)
        return position

    def _progress(self, stored: StoredVersion, position: int, received: int) -> None:
        stored.advance(position)
        self.core.metrics.bytes_received.inc(received)

    # --- fetch --------------------------------------------------------------------------------

    async def _fetch(self, conn: socket.socket, request: pb.FetchRequest) -> None:
        if request.version < 0:
            message = f"version must be >= 0, got {request.version}"
            await self._send(conn, _reply(grpc.StatusCode.INVALID_ARGUMENT, message))
            return
        try:
            stored = self.core.store.get(request.version)
        except StoreError as err:
            await self._send(conn, _reply(status_of(err), str(err)))
            return
        opened = stored.manifest
        await self._send(conn, pb.BulkReply(manifest=opened.to_proto()))
        total, idle_s = stored.manifest.total_bytes, self.core.upload_idle_timeout_s
        busy = self.forward_streams and self._forwarding >= self.forward_streams
        if stored.state is VersionState.UPLOADING and busy:
            await stored.wait_past(total - 1, idle_s)  # until the upload ends, either way
        forwarding = stored.state is VersionState.UPLOADING
        self._forwarding += forwarding
        try:
            with stored.reading() as data:
                if not await self._send_version(conn, stored, data, request.replica_id):
                    return
        finally:
            self._forwarding -= forwarding
        if opened.is_open:
            # Its last bytes may be verified after they were forwarded: wait for the commit.
            while stored.state is VersionState.UPLOADING:
                await stored.wait_past(total, idle_s)
            if stored.state is not VersionState.COMPLETE:
                log.info("fetch of version %d by %r cut: %s", stored.version, request.replica_id, stored.error)
                return
            await self._send(conn, pb.BulkReply(manifest=stored.manifest.to_proto()))

    async def _send_version(self, conn: socket.socket, stored: StoredVersion, data: memoryview, replica: str) -> bool:
        """Sends every byte as it arrives; False when the upload failed and the stream was cut."""
        total, sent = stored.manifest.total_bytes, 0
        bytes_sent = self.core.metrics.bytes_sent.labels("dataplane")
        while sent < total:
            await stored.wait_past(sent, self.core.upload_idle_timeout_s)
            if stored.state is VersionState.FAILED:
                # Closing early is the signal: the replica sees a short stream and loads nothing.
                log.info("fetch of version %d by %r cut: %s", stored.version, replica, stored.error)
                return False
            available = total if stored.state is VersionState.COMPLETE else stored.received
            count = min(available - sent, SEND_BYTES)
            await self._io(conn.sendall, data[sent : sent + count])
            bytes_sent.inc(count)
            sent += count
        return True
