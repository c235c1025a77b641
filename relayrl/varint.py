"""Protobuf's base-128 varints, for the services that frame their hot messages by hand (the
queue's Push/Pull, paramsync's weight chunks) instead of copying bytes through messages."""

from __future__ import annotations

_INT64_MASK = (1 << 64) - 1


def encode_varint(value: int) -> bytes:
    """``value`` as protobuf writes an int64/uint64 field (a negative one in two's complement)."""
    value &= _INT64_MASK
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; ValueError when it is cut off or longer than 64 bits."""
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
