"""Chunk messages framed by hand: byte-for-byte what protobuf produces, minus two copies each way.

A ``WeightStreamMessage`` holding a ``WeightChunk`` is ``0x12 len(chunk) | 0x0a len name | 0x10
offset | 0x1a len data``. Building it with one ``join`` (instead of bytes → message → serialize)
and reading ``data`` as a view of the received buffer (instead of message → bytes) saves two full
copies of every weight byte on each side; at hundreds of MB per version that is most of the CPU
time. Anything that is not a plain chunk (the manifest, unknown fields) goes through protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.v1 import paramsync_pb2 as pb
from relayrl.varint import decode_varint, encode_varint

_CHUNK_FIELD = 0x12  # WeightStreamMessage.chunk: field 2, length-delimited
_NAME_FIELD = 0x0A  # WeightChunk.tensor_name: field 1, length-delimited
_OFFSET_FIELD = 0x10  # WeightChunk.offset: field 2, varint
_DATA_FIELD = 0x1A  # WeightChunk.data: field 3, length-delimited


@dataclass(frozen=True, slots=True)
class RawChunk:
    """A decoded chunk whose ``data`` is a view into the received message (no copy)."""

    tensor_name: str
    offset: int
    data: memoryview


def encode_chunk(tensor_name: str, offset: int, data: bytes | memoryview) -> bytes:
    name = tensor_name.encode()
    body = [_NAME_FIELD.to_bytes(1, "little"), encode_varint(len(name)), name] if name else []
    if offset:
        body += [_OFFSET_FIELD.to_bytes(1, "little"), encode_varint(offset)]
    size = len(data) if isinstance(data, bytes) else data.nbytes
    if size:
        body += [_DATA_FIELD.to_bytes(1, "little"), encode_varint(size), data]
    inner = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in body)
    return b"".join([_CHUNK_FIELD.to_bytes(1, "little"), encode_varint(inner), *body])


def _decode_chunk(buf: memoryview) -> RawChunk | None:
    """The chunk in ``buf``, or None when it holds anything else (then protobuf decodes it)."""
    if not buf.nbytes or buf[0] != _CHUNK_FIELD:
        return None
    inner, pos = decode_varint(buf, 1)
    end = pos + inner
    if end != buf.nbytes:
        return None
    name, offset, data = "", 0, buf[0:0]
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag == _OFFSET_FIELD:
            offset, pos = decode_varint(buf, pos)
            if offset >= 1 << 63:
                offset -= 1 << 64
        elif tag in (_NAME_FIELD, _DATA_FIELD):
            length, pos = decode_varint(buf, pos)
            if pos + length > end:
                raise ValueError("field runs past the end of the message")
            if tag == _NAME_FIELD:
                name = bytes(buf[pos : pos + length]).decode()
            else:
                data = buf[pos : pos + length]
            pos += length
        else:
            return None
    return RawChunk(name, offset, data)


def decode_stream_message(raw: bytes) -> pb.WeightStreamMessage | RawChunk:
    """gRPC deserializer for WeightStreamMessage streams."""
    try:
        chunk = _decode_chunk(memoryview(raw))
    except (ValueError, IndexError, UnicodeDecodeError):
        chunk = None  # let protobuf report what is wrong with it
    return chunk if chunk is not None else pb.WeightStreamMessage.FromString(raw)


def serialize_stream_message(message: pb.WeightStreamMessage | bytes) -> bytes:
    """gRPC serializer for WeightStreamMessage streams: hand-framed chunks pass through as they are."""
    return message if isinstance(message, bytes) else message.SerializeToString()
