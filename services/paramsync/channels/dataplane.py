"""The data plane's connections and framing, shared by the channels that ride on it: ``tcp``
(bytes on the socket) and ``shared_memory`` (bytes left in memory; only control messages here).

Only :class:`BulkRequest` and :class:`BulkReply` (and a streamed upload's
``TensorChecksums``) are framed: a 4-byte big-endian length, then the protobuf.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from relayrl import threads
from relayrl.v1 import paramsync_pb2 as pb
from services.paramsync.errors import ParamSyncError, from_status

# --- framing of the control messages -------------------------------------------------------

LENGTH = struct.Struct(">I")
# A manifest of 100k tensors is about 10 MB; anything far larger is not a control message.
MAX_FRAME_BYTES = 64 * 1024 * 1024

M = TypeVar("M", bound=Message)
T = TypeVar("T")


class FrameError(ValueError):
    """The peer sent something that is not a valid frame."""


def frame(message: Message) -> bytes:
    body = message.SerializeToString()
    return LENGTH.pack(len(body)) + body


def _parse(body: bytes, message_type: type[M]) -> M:
    try:
        return message_type.FromString(body)
    except DecodeError as exc:
        raise FrameError(f"{message_type.__name__} does not decode: {exc}") from None


def _check_length(length: int) -> int:
    if length > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {length} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return length


def recv_exactly(sock: socket.socket, view: memoryview) -> None:
    """Fills ``view`` from a blocking socket; ConnectionError if the peer closes first."""
    filled = 0
    while filled < view.nbytes:
        received = sock.recv_into(view[filled:])
        if received == 0:
            raise ConnectionError(f"connection closed after {filled} of {view.nbytes} bytes")
        filled += received


def recv_frame(sock: socket.socket, message_type: type[M]) -> M:
    header = bytearray(LENGTH.size)
    recv_exactly(sock, memoryview(header))
    body = bytearray(_check_length(LENGTH.unpack(header)[0]))
    recv_exactly(sock, memoryview(body))
    return _parse(bytes(body), message_type)


# --- connections ----------------------------------------------------------------------------

# A data plane that does not answer within this is treated as absent (e.g. a firewalled port).
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class DataPlaneAddress:
    host: str
    port: int


class DataPlaneUnreachable(ConnectionError):
    """The data plane did not accept a connection; the caller may fall back to gRPC."""


async def connect(address: DataPlaneAddress, timeout_s: float) -> socket.socket:
    """A connected blocking socket whose calls time out after ``timeout_s``; DataPlaneUnreachable if none."""
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
    sock.settimeout(timeout_s)
    return sock


def check_reply(reply: pb.BulkReply) -> pb.BulkReply:
    if reply.code:
        raise from_status(reply.code, reply.message)
    return reply


def link_error(exc: BaseException, doing: str) -> ParamSyncError:
    if isinstance(exc, TimeoutError):
        return ParamSyncError(f"data plane timed out while {doing}", grpc.StatusCode.DEADLINE_EXCEEDED)
    return ParamSyncError(f"data plane link failed while {doing}: {exc}", grpc.StatusCode.UNAVAILABLE)


async def in_thread(sock: socket.socket, call: Callable[..., T], *args: object) -> T:
    """Runs blocking socket work in a thread; cancelling the caller shuts the socket so it returns.

    A thread with blocking calls (``MSG_WAITALL``, a C-level ``sendall``) spends about 20% less
    CPU per byte than asyncio's readiness round trips, measured on loopback here. The thread lets
    go of ``args`` as it returns (:mod:`relayrl.threads`): a sent bucket's bytes are then free.
    """
    try:
        return await threads.to_thread(call, *args)
    except asyncio.CancelledError:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        raise


def exchange(sock: socket.socket, request: Message) -> pb.BulkReply:
    sock.sendall(frame(request))
    return recv_frame(sock, pb.BulkReply)


def status_reply(code: grpc.StatusCode, message: str = "") -> pb.BulkReply:
    return pb.BulkReply(code=code.value[0], message=message)
