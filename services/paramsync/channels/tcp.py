"""``tcp``: the bulk data plane, both its ends: Publish and Fetch over plain TCP beside gRPC,
the weight bytes unframed (``BulkRequest`` in ``protos/relayrl/v1/paramsync.proto``).

Python gRPC moves one hop at about 1.5 GB/s on the CI machine and every chunk crosses the
Python boundary; a version must cross two hops (trainer → paramsync → replica). Here the bytes of
an upload go from the socket straight into the version's memory (``recv_into``) and are hashed
where they land; a fetch sends slices of that memory. Socket calls run in threads, so the upload
and every fetch use their own core where there is one. (``sendfile`` from a memory file was
measured too: on loopback it cost more CPU than ``sendall``, 0.30 s against 0.21 s per 512 MiB.)

- **Framing.** Only :class:`BulkRequest` and :class:`BulkReply` are framed (a 4-byte big-endian
  length, then the protobuf; ``dataplane.py``); the weight bytes between them travel raw. A run
  of an upload that lies in a memory file of a trainer on paramsync's host is named, not sent:
  paramsync copies it from the file (``TensorChecksums.shared``, ``memory_files.py``).
- **The peer's end** (:class:`TcpChannel`: the trainer sends, a replica receives). One TCP
  connection per operation; the bytes move in a worker thread with blocking calls, and
  cancelling the caller shuts the connection, which stops the transfer. The trainer sends each
  tensor's memory as it is (no chunk copies); a replica receives the version straight into the
  memory it names once the manifest is known (one buffer its tensors then view, or the mapping of
  a safetensors file, see ``memfile.py``), hashing each piece as it lands. Errors carry the gRPC
  status the server named; link failures are UNAVAILABLE or DEADLINE_EXCEEDED, which the client
  retries like their gRPC counterparts.
- **Paramsync's end** (:class:`DataPlaneServer`): receives uploads into the store and feeds
  fetches from it. The rules (newer only, checksums, the previous version kept on failure,
  forwarding while uploading) are those of the Publish and Fetch RPCs, through the same core
  (:class:`~services.paramsync.core.ParamSyncCore`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from relayrl.v1 import paramsync_pb2 as pb
from services.paramsync.channels.base import ByteChannel, Place, TensorRun, check_digests
from services.paramsync.channels.dataplane import (
    DataPlaneAddress,
    FrameError,
    T,
    check_reply,
    connect,
    exchange,
    frame,
    in_thread,
    link_error,
    recv_frame,
    status_reply,
)
from services.paramsync.channels.shared_memory import serve_map
from services.paramsync.core import ParamSyncCore, check_link
from services.paramsync.digest import new_hasher
from services.paramsync.errors import (
    ChecksumMismatch,
    ParamSyncError,
    StageDeadline,
    stage_deadline_error,
    status_of,
)
from services.paramsync.manifest import Manifest
from services.paramsync.memory import RecycledMemory, VersionMemory
from services.paramsync.store import StoredVersion, StoreError, UploadWriter, VersionState

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# Bytes received per step: large enough that per-step overhead vanishes, small enough that
# replicas get each piece while a big tensor is still arriving (paramsync forwards as it lands).
RECV_BYTES = 4 * 1024 * 1024

# --- the peer's end: a trainer sends, a replica receives --------------------------------


def _send_version(sock: socket.socket, views: Sequence[memoryview]) -> pb.BulkReply:
    _send_views(sock, views)
    return recv_frame(sock, pb.BulkReply)


def _send_views(sock: socket.socket, views: Sequence[memoryview], header: bytes = b"") -> None:
    try:
        if header:
            sock.sendall(header)
        for view in views:
            sock.sendall(view)
    except OSError:
        # Paramsync stops reading when it refuses the upload midway; its reason, if it got
        # that far, is waiting on the socket.
        with contextlib.suppress(OSError, FrameError):
            sock.settimeout(5)
            check_reply(recv_frame(sock, pb.BulkReply))
        raise


async def publish(address: DataPlaneAddress, manifest: Manifest, views: Sequence[memoryview], timeout_s: float) -> int:
    """Uploads ``manifest`` and the tensors' bytes; returns the bytes paramsync stored (0: already held)."""
    sock = await connect(address, timeout_s)
    with sock:
        try:
            async with asyncio.timeout(timeout_s):
                go = await in_thread(sock, exchange, sock, pb.BulkRequest(publish=manifest.to_proto()))
                if go.code == grpc.StatusCode.ALREADY_EXISTS.value[0]:
                    return 0
                check_reply(go)
                return check_reply(await in_thread(sock, _send_version, sock, views)).bytes_received
        except (OSError, TimeoutError, FrameError) as exc:
            raise link_error(exc, f"uploading version {manifest.version}") from exc


async def publish_runs(
    address: DataPlaneAddress,
    manifest: Manifest,
    runs: AsyncIterator[TensorRun],
    resume_from: int,
    timeout_s: float,
    on_shared_refused: Callable[[str], None] | None = None,
) -> int:
    """Uploads an open ``manifest`` run by run from byte ``resume_from``, each run's checksums and
    end before its bytes; returns the bytes paramsync stored (0: already held). A run lying in a memory
    file of this process is named instead of sent, until paramsync says it cannot read the file
    (then ``on_shared_refused`` hears why, and every run travels as bytes).

    Waiting for the next run is the caller's (``runs`` bounds it); every exchange with paramsync is
    bounded by ``timeout_s`` and fails with an error naming the stage, the peer and the version.
    """
    peer = f"paramsync data plane {address.host}:{address.port}"
    sock = await connect(address, timeout_s)
    stage = "upload start"
    with sock:
        try:
            async with asyncio.timeout(timeout_s):
                request = pb.BulkRequest(publish=manifest.to_proto(), resume_from_bytes=resume_from)
                go = await in_thread(sock, exchange, sock, request)
            if go.code == grpc.StatusCode.ALREADY_EXISTS.value[0]:
                return 0
            check_reply(go)
            sharing = True
            async for run in runs:
                stage = "upload"
                checksums = pb.TensorChecksums(first_tensor=run.first_tensor, checksums=run.checksums, end_byte=run.end)
                async with asyncio.timeout(timeout_s):
                    if sharing and run.shared is not None:
                        fd, offsets = run.shared
                        checksums.shared.CopyFrom(
                            pb.SharedBytes(host=socket.gethostname(), pid=os.getpid(), fd=fd, offsets=offsets)
                        )
                        copied = await in_thread(sock, exchange, sock, checksums)
                        if copied.code == grpc.StatusCode.UNIMPLEMENTED.value[0]:
                            sharing = False
                            if on_shared_refused is not None:
                                on_shared_refused(copied.message)
                            # The run's bytes follow its checksums, already sent.
                            await in_thread(sock, _send_views, sock, run.views)
                        else:
                            check_reply(copied)
                    else:
                        await in_thread(sock, _send_views, sock, run.views, frame(checksums))
                # Sent: let go of its bytes before waiting for the next run, so its bucket's memory
                # is free for the bucket after it.
                del run
                stage = "upload (waiting for the next bucket)"
            stage = "commit"
            async with asyncio.timeout(timeout_s):
                return check_reply(await in_thread(sock, recv_frame, sock, pb.BulkReply)).bytes_received
        except StageDeadline:
            raise  # the trainer's own stall (the gather), not the link's: not worth a retry
        except TimeoutError as exc:
            raise stage_deadline_error(stage, peer, manifest.version, timeout_s) from exc
        except (OSError, FrameError) as exc:
            raise ParamSyncError(
                f"{stage} of version {manifest.version} (peer: {peer}) failed: {exc}", grpc.StatusCode.UNAVAILABLE
            ) from exc


# Each tensor starts on this boundary inside the receive memory, so any dtype view is aligned.
ALIGN_BYTES = 64


def _layout(manifest: Manifest) -> tuple[list[int], int]:
    """Aligned start of every tensor inside one receive buffer, and the buffer's size."""
    starts, position = [], 0
    for spec in manifest.tensors:
        starts.append(position)
        position += -(-spec.num_bytes // ALIGN_BYTES) * ALIGN_BYTES
    return starts, position


@dataclass(frozen=True, slots=True)
class ReceivedVersion:
    manifest: Manifest
    tensors: dict[str, torch.Tensor]  # verified, views into one buffer


def _receive_version(sock: socket.socket, manifest: Manifest, place: Place) -> Manifest:
    """Receives every tensor into its view from ``place``, hashing each piece as it lands; returns
    the complete manifest (for an open one, the one that follows the bytes) every tensor matched."""
    digests = []
    for spec, view in zip(manifest.tensors, place(manifest), strict=True):
        hasher, filled = new_hasher(manifest.checksum_algorithm), 0
        while filled < spec.num_bytes:
            received = sock.recv_into(view[filled : filled + RECV_BYTES], 0, socket.MSG_WAITALL)
            if received == 0:
                raise ConnectionError(f"stream ended inside {spec.name!r} at {filled}/{spec.num_bytes}")
            hasher.update(view[filled : filled + received])
            filled += received
        digests.append(hasher.hexdigest())
    if manifest.is_open:
        closed = Manifest.from_proto(check_reply(recv_frame(sock, pb.BulkReply)).manifest)
        if closed.layout() != manifest.layout():
            raise ChecksumMismatch(f"version {manifest.version}: the closing manifest lists other tensors")
        manifest = closed
    return check_digests(manifest, digests)


async def fetch_into(address: DataPlaneAddress, request: pb.FetchRequest, timeout_s: float, place: Place) -> Manifest:
    """Downloads a version into the views ``place`` gives (called in the receiving thread once
    the manifest is known); ChecksumMismatch if any tensor differs from the manifest."""
    sock = await connect(address, timeout_s)
    with sock:
        try:
            async with asyncio.timeout(timeout_s):
                reply = check_reply(await in_thread(sock, exchange, sock, pb.BulkRequest(fetch=request)))
                manifest = Manifest.from_proto(reply.manifest)
                manifest = await in_thread(sock, _receive_version, sock, manifest, place)
        except (OSError, TimeoutError, FrameError) as exc:
            raise link_error(exc, f"fetching version {request.version}") from exc
    return manifest


async def fetch(
    address: DataPlaneAddress, request: pb.FetchRequest, timeout_s: float, memory: RecycledMemory | None = None
) -> ReceivedVersion:
    """Downloads a version as tensors, each checked against the manifest.

    ChecksumMismatch if any tensor differs; the tensors are returned only when all match. With
    ``memory``, the version is received into its kept buffer, and the buffer is given back to it
    once every returned tensor is gone.
    """
    import numpy as np
    import torch

    from services.paramsync.tensors import typed_view

    placed: list[tuple[VersionMemory, list[int], int]] = []

    def place(manifest: Manifest) -> list[memoryview]:
        starts, size = _layout(manifest)
        target = memory.take(size) if memory is not None else VersionMemory(size)
        placed.append((target, starts, size))
        pairs = zip(manifest.tensors, starts, strict=True)
        return [target.view[start : start + spec.num_bytes] for spec, start in pairs]

    manifest = await fetch_into(address, request, timeout_s, place)
    target, starts, size = placed[0]
    # Every tensor keeps this array alive, so its finalizer runs when the last one is gone.
    base = np.frombuffer(target.map, dtype=np.uint8, count=max(size, 1))
    if memory is not None:
        weakref.finalize(base, memory.give_back, target)
    whole = torch.from_numpy(base)
    tensors = {
        spec.name: typed_view(whole[start : start + spec.num_bytes], spec)
        for spec, start in zip(manifest.tensors, starts, strict=True)
    }
    return ReceivedVersion(manifest, tensors)


@dataclass(frozen=True, slots=True)
class TcpChannel(ByteChannel):
    """The peer's end of the data plane at ``address``: one connection per transfer, each exchange
    bounded by ``timeout_s``; ``replica_id`` names the receiving replica in paramsync's table."""

    name = "tcp"

    address: DataPlaneAddress
    timeout_s: float
    replica_id: str = ""
    # Told why, when paramsync cannot read this process's memory files (runs then travel as bytes).
    on_shared_refused: Callable[[str], None] | None = None

    async def send(self, manifest: Manifest, runs: AsyncIterator[TensorRun], resume_from: int = 0) -> int:
        return await publish_runs(self.address, manifest, runs, resume_from, self.timeout_s, self.on_shared_refused)

    async def receive(self, version: int, place: Place) -> Manifest:
        request = pb.FetchRequest(replica_id=self.replica_id, version=version)
        return await fetch_into(self.address, request, self.timeout_s, place)


# --- paramsync's end ------------------------------------------------------------------------

# Bytes handed to one sendall.
SEND_BYTES = 64 * 1024 * 1024
# Bytes copied per read from a sender's memory file: progress reaches fetchers piece by piece.
COPY_BYTES = 16 * 1024 * 1024
# Transfers running at once; each holds a thread only while it is inside a socket call.
MAX_TRANSFER_THREADS = 64


def _run_bounds(stored: StoredVersion, position: int, run: pb.TensorChecksums) -> tuple[int, list[tuple[int, int]]]:
    """Where a run that begins at ``position`` ends (its ``end_byte``, or the end of the last tensor
    it has a checksum for) and its parts (``Manifest.run_parts``); StoreError unless it begins
    inside its first tensor and ends in the version."""
    manifest = stored.manifest
    ends = [*manifest.offsets()[1:], manifest.total_bytes]
    first = run.first_tensor
    end = run.end_byte
    if not end and first >= 0 and run.checksums and first + len(run.checksums) <= len(ends):
        end = ends[first + len(run.checksums) - 1]
    try:
        return end, manifest.run_parts(first, position, end)
    except ValueError as exc:
        raise StoreError(
            "bad_message", f"version {stored.version}: a run where byte {position} is due: {exc}"
        ) from None


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

    async def send_reply(self, conn: socket.socket, reply: pb.BulkReply) -> None:
        """Sends one framed reply on ``conn`` (from a transfer thread)."""
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
                elif operation == "map":
                    await serve_map(self, conn, request.map)
                else:
                    await self.send_reply(
                        conn, status_reply(grpc.StatusCode.INVALID_ARGUMENT, "BulkRequest names no operation")
                    )
            except FrameError as exc:
                with contextlib.suppress(OSError):
                    await self.send_reply(conn, status_reply(grpc.StatusCode.INVALID_ARGUMENT, str(exc)))
            except OSError as exc:  # includes timeouts and peers that went away
                log.info("data plane connection from %s ended: %s", peer, exc or type(exc).__name__)

    # --- publish ------------------------------------------------------------------------------

    async def _publish(self, conn: socket.socket, proto: pb.WeightManifest, resume_from: int) -> None:
        try:
            manifest = Manifest.from_proto(proto)
        except ValueError as exc:
            self.core.metrics.publish_failures.labels("invalid_manifest").inc()
            await self.send_reply(conn, status_reply(grpc.StatusCode.INVALID_ARGUMENT, f"invalid manifest: {exc}"))
            return
        try:
            stored = self.core.begin_upload(manifest, resume_from)
        except StoreError as err:
            await self.send_reply(conn, status_reply(status_of(err), str(err)))
            return
        if stored is None:
            await self.send_reply(
                conn, status_reply(grpc.StatusCode.ALREADY_EXISTS, "the latest version has these bytes")
            )
            return
        started, epoch = time.perf_counter(), stored.link_epoch
        try:
            await self.send_reply(conn, status_reply(grpc.StatusCode.OK))
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
                await self.send_reply(conn, status_reply(status_of(err), str(err)))
            return
        except (OSError, asyncio.CancelledError):
            self.core.link_broke(stored, epoch)
            raise
        await self.send_reply(conn, pb.BulkReply(bytes_received=received))

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
        runs, each after a framed TensorChecksums.
        """
        writer = stored.writer
        assert writer is not None
        manifest = stored.manifest
        position = writer.position
        # The sender's memory files opened so far ((pid, fd) → this process's descriptor).
        sources: dict[tuple[int, int], int] = {}
        try:
            while position < manifest.total_bytes:
                end = manifest.total_bytes
                if manifest.is_open:
                    run = recv_frame(conn, pb.TensorChecksums)
                    end, parts = _run_bounds(stored, position, run)
                    writer.add_checksums(run.first_tensor, list(run.checksums))
                    writer.begin_run()
                    if run.HasField("shared"):
                        if len(run.shared.offsets) != len(parts):
                            raise StoreError(
                                "bad_message",
                                f"version {stored.version}: a shared run's offsets do not match its tensors",
                            )
                        source = self._open_source(conn, run.shared, sources)
                        if source is not None:
                            self._copy_run(stored, epoch, writer, loop, parts, run.shared, source)
                            conn.sendall(frame(pb.BulkReply()))
                            position = end
                            continue
                position = self._receive_run(conn, stored, epoch, writer, loop, position, end)
        finally:
            for source in sources.values():
                os.close(source)

    def _open_source(
        self, conn: socket.socket, shared: pb.SharedBytes, sources: dict[tuple[int, int], int]
    ) -> int | None:
        """The sender's memory file, opened once per upload; None (and the sender told so, so
        that it sends the run's bytes) when this process cannot read it."""
        key = (shared.pid, shared.fd)
        if key in sources:
            return sources[key]
        if shared.host != socket.gethostname():
            reason = f"paramsync runs on host {socket.gethostname()!r}, the sender on {shared.host!r}"
        else:
            try:
                sources[key] = os.open(f"/proc/{shared.pid}/fd/{shared.fd}", os.O_RDONLY | os.O_CLOEXEC)
                return sources[key]
            except OSError as exc:
                reason = f"paramsync cannot open the sender's memory file: {exc}"
        conn.sendall(frame(status_reply(grpc.StatusCode.UNIMPLEMENTED, reason)))
        return None

    def _copy_run(
        self,
        stored: StoredVersion,
        epoch: int,
        writer: UploadWriter,
        loop: asyncio.AbstractEventLoop,
        parts: list[tuple[int, int]],
        shared: pb.SharedBytes,
        source: int,
    ) -> None:
        """Copies a run from the sender's memory file into the version, part by part (``parts``: where
        each lies in the version and its size), checking the bytes as received bytes are checked (a
        wrong file fails its checksums)."""
        # The caller checked there is one offset per part.
        data = stored.data
        for (position, nbytes), offset in zip(parts, shared.offsets, strict=True):
            done = 0
            while done < nbytes:
                check_link(stored, epoch)
                count = os.preadv(source, [data[position : position + min(COPY_BYTES, nbytes - done)]], offset + done)
                if count <= 0:
                    raise StoreError(
                        "incomplete",
                        f"version {stored.version}: the sender's memory file ends {nbytes - done} bytes short",
                    )
                writer.check_in_place(position, count)
                position, done = position + count, done + count
                loop.call_soon_threadsafe(self._progress, stored, position, count, True)

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

    def _progress(self, stored: StoredVersion, position: int, received: int, copied: bool = False) -> None:
        stored.advance(position)
        self.core.metrics.bytes_received.inc(received)
        if copied:
            self.core.metrics.bytes_copied.inc(received)

    # --- fetch --------------------------------------------------------------------------------

    async def _fetch(self, conn: socket.socket, request: pb.FetchRequest) -> None:
        if request.version < 0:
            message = f"version must be >= 0, got {request.version}"
            await self.send_reply(conn, status_reply(grpc.StatusCode.INVALID_ARGUMENT, message))
            return
        try:
            stored = self.core.store.get(request.version)
        except StoreError as err:
            await self.send_reply(conn, status_reply(status_of(err), str(err)))
            return
        opened = stored.manifest
        await self.send_reply(conn, pb.BulkReply(manifest=opened.to_proto()))
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
            if not await stored.wait_ended(idle_s):
                log.info("fetch of version %d by %r cut: %s", stored.version, request.replica_id, stored.error)
                return
            await self.send_reply(conn, pb.BulkReply(manifest=stored.manifest.to_proto()))

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
