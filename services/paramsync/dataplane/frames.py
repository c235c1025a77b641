"""Framing of the bulk data plane's control messages: a 4-byte big-endian length, then the protobuf.

Only :class:`BulkRequest` and :class:`BulkReply` (``protos/relayrl/v1/paramsync.proto``) are
framed; the weight bytes between them travel raw. Both ends do their socket work in threads with
blocking calls, so these helpers block.
"""

from __future__ import annotations

import socket
import struct
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

LENGTH = struct.Struct(">I")
# A manifest of 100k tensors is about 10 MB; anything far larger is not a control message.
MAX_FRAME_BYTES = 64 * 1024 * 1024

M = TypeVar("M", bound=Message)


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
