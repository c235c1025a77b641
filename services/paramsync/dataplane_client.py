"""The client half of the bulk data plane (``BulkRequest`` in ``paramsync.proto``).

One non-blocking TCP connection per operation on the caller's asyncio loop, so cancelling the
caller stops the transfer. The trainer sends each tensor's memory as it is (no chunk copies);
a replica receives the version straight into one buffer, which its tensors then view, hashing
each piece as it lands.
Errors carry the gRPC status the server named; link failures are UNAVAILABLE or
DEADLINE_EXCEEDED, which the client retries like their gRPC counterparts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from relayrl.v1 import paramsync_pb2 as pb
from services.paramsync.dataplane_frames import FrameError, frame, read_frame
from services.paramsync.digest import new_hasher
from services.paramsync.errors import ChecksumMismatch, ParamSyncError, from_status
from services.paramsync.manifest import Manifest
from services.paramsync.memory import VersionMemory

if TYPE_CHECKING:
    import torch

RECV_BYTES = 4 * 1024 * 1024
# A data plane that does not answer within this is treated as absent (e.g. a firewalled port).
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class DataPlaneAddress:
    host: str
    port: int


class DataPlaneUnreachable(ConnectionError):
    """The data plane did not accept a connection; the caller may fall back to gRPC."""


async def _connect(address: DataPlaneAddress, timeout_s: float) -> socket.socket:
    """A connected non-blocking socket; DataPlaneUnreachable if none can be opened."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(min(timeout_s, CONNECT_TIMEOUT_S)):
            infos = await loop.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
            family, kind, proto, _, sockaddr = infos[0]
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, sockaddr)
            except BaseException:
                sock.close()
                raise
    except (OSError, TimeoutError) as exc:
        raise DataPlaneUnreachable(f"data plane {address.host}:{address.port} unreachable: {exc}") from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _check(reply: pb.BulkReply) -> pb.BulkReply:
    if reply.code:
        raise from_status(reply.code, reply.message)
    return reply


def _link_error(exc: BaseException, doing: str) -> ParamSyncError:
    if isinstance(exc, TimeoutError):
        return ParamSyncError(f"data plane timed out while {doing}", grpc.StatusCode.DEADLINE_EXCEEDED)
    return ParamSyncError(f"data plane link failed while {doing}: {exc}", grpc.StatusCode.UNAVAILABLE)


async def publish(address: DataPlaneAddress, manifest: Manifest, views: Sequence[memoryview], timeout_s: float) -> int:
    """Uploads ``manifest`` and the tensors' bytes; returns the bytes paramsync stored (0: already held)."""
    loop = asyncio.get_running_loop()
    sock = await _connect(address, timeout_s)
    with sock:
        try:
            async with asyncio.timeout(timeout_s):
                await loop.sock_sendall(sock, frame(pb.BulkRequest(publish=manifest.to_proto())))
                go = await read_frame(loop, sock, pb.BulkReply)
                if go.code == grpc.StatusCode.ALREADY_EXISTS.value[0]:
                    return 0
                _check(go)
                try:
                    for view in views:
                        await loop.sock_sendall(sock, view)
                except OSError:
                    # Paramsync stops reading when it refuses the upload midway; its reason,
                    # if it got that far, is waiting on the socket.
                    with contextlib.suppress(OSError, FrameError, TimeoutError):
                        async with asyncio.timeout(5):
                            _check(await read_frame(loop, sock, pb.BulkReply))
                    raise
                return _check(await read_frame(loop, sock, pb.BulkReply)).bytes_received
        except (OSError, TimeoutError, FrameError) as exc:
            raise _link_error(exc, f"uploading version {manifest.version}") from exc


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
    memory_bytes: int  # size of that buffer


async def fetch(
    address: DataPlaneAddress, request: pb.FetchRequest, timeout_s: float, memory: Callable[[int], VersionMemory]
) -> ReceivedVersion:
    """Downloads a version into ``memory(size)``, each tensor checked against the manifest.

    ChecksumMismatch if any tensor differs; the tensors are returned only when all match.
    """
    import torch

    from services.paramsync.tensors import typed_view

    loop = asyncio.get_running_loop()
    sock = await _connect(address, timeout_s)
    with sock:
        try:
            async with asyncio.timeout(timeout_s):
                await loop.sock_sendall(sock, frame(pb.BulkRequest(fetch=request)))
                manifest = Manifest.from_proto(_check(await read_frame(loop, sock, pb.BulkReply)).manifest)
                starts, size = _layout(manifest)
                target = memory(size)
                for spec, start in zip(manifest.tensors, starts, strict=True):
                    view, hasher = target.view[start : start + spec.num_bytes], new_hasher(manifest.checksum_algorithm)
                    filled = 0
                    while filled < spec.num_bytes:
                        received = await loop.sock_recv_into(sock, view[filled : filled + RECV_BYTES])
                        if received == 0:
                            raise ConnectionError(f"stream ended inside {spec.name!r} at {filled}/{spec.num_bytes}")
                        hasher.update(view[filled : filled + received])
                        filled += received
                    if hasher.hexdigest() != spec.checksum:
                        raise ChecksumMismatch(f"tensor {spec.name!r} of version {manifest.version}: checksum differs")
        except (OSError, TimeoutError, FrameError) as exc:
            raise _link_error(exc, f"fetching version {request.version}") from exc
    whole = torch.frombuffer(target.map, dtype=torch.uint8, count=max(size, 1))
    tensors = {
        spec.name: typed_view(whole[start : start + spec.num_bytes], spec)
        for spec, start in zip(manifest.tensors, starts, strict=True)
    }
    return ReceivedVersion(manifest, tensors, size)
