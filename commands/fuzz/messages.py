"""Random and mutated protobuf messages built from message descriptors alone.

Values lean on the edges a handler mishandles: out-of-range and negative numbers, NaN and
infinities, empty and very long strings, repeated fields of the wrong length or huge sizes.
"""

from __future__ import annotations

import math
import random
from typing import Any

from google.protobuf import descriptor as D
from google.protobuf.message import Message

_INT32 = (0, 1, -1, 2, 7, 2**31 - 1, -(2**31))
_INT64 = (0, 1, -1, 3, 2**63 - 1, -(2**63), 2**40)
_UINT32 = (0, 1, 2**32 - 1)
_UINT64 = (0, 1, 2**64 - 1)
_DOUBLE = (0.0, -0.0, 0.01, 0.5, 1.0, -1.0, 1e308, -1e308, math.inf, -math.inf, math.nan, 5e-324)
_FLOAT = (0.0, -0.5, 1.0, -1.0, 3.0e38, math.inf, -math.inf, math.nan)
_STRINGS = ("", "a", "g0", "0-0", "rollout-0", "../../etc/passwd", "\x00", "é✓\U0001f600", "{", "null")
# Kept small enough that a run of 10,000 calls stays within memory; `huge` messages go further.
_MAX_REPEATED = 64
_MAX_DEPTH = 4
_SHORTEST = {D.FieldDescriptor.TYPE_STRING: "h", D.FieldDescriptor.TYPE_BYTES: b"h"}

_INT_KINDS = {
    D.FieldDescriptor.TYPE_INT32: _INT32,
    D.FieldDescriptor.TYPE_SINT32: _INT32,
    D.FieldDescriptor.TYPE_SFIXED32: _INT32,
    D.FieldDescriptor.TYPE_INT64: _INT64,
    D.FieldDescriptor.TYPE_SINT64: _INT64,
    D.FieldDescriptor.TYPE_SFIXED64: _INT64,
    D.FieldDescriptor.TYPE_UINT32: _UINT32,
    D.FieldDescriptor.TYPE_FIXED32: _UINT32,
    D.FieldDescriptor.TYPE_UINT64: _UINT64,
    D.FieldDescriptor.TYPE_FIXED64: _UINT64,
}


def _is_repeated(field: D.FieldDescriptor) -> bool:
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == D.FieldDescriptor.LABEL_REPEATED


def scalar(rng: random.Random, field: D.FieldDescriptor) -> Any:
    """One edge-leaning value for a scalar field."""
    t = field.type
    if t in _INT_KINDS:
        edges = _INT_KINDS[t]
        return rng.choice(edges) if rng.random() < 0.5 else rng.randint(min(edges) // 2**8, max(edges) // 2**8)
    if t == D.FieldDescriptor.TYPE_DOUBLE:
        return rng.choice(_DOUBLE) if rng.random() < 0.6 else rng.uniform(-5, 5)
    if t == D.FieldDescriptor.TYPE_FLOAT:
        return rng.choice(_FLOAT) if rng.random() < 0.6 else rng.uniform(-5, 5)
    if t == D.FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if t == D.FieldDescriptor.TYPE_STRING:
        return random_text(rng)
    if t == D.FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(rng.choice((0, 1, 8, 300)))
    if t == D.FieldDescriptor.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values]
        return rng.choice([*numbers, 999, -1])
    raise TypeError(f"unhandled field type {t}")


def random_text(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.6:
        return rng.choice(_STRINGS)
    if roll < 0.9:
        return "".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(1, 40)))
    return "x" * rng.choice((1000, 70_000))


def fill(rng: random.Random, msg: Message, depth: int = 0, presence: float = 0.7) -> Message:
    """Sets a random subset of ``msg``'s fields to random values, recursively."""
    for field in msg.DESCRIPTOR.fields:
        if rng.random() > presence:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            target = getattr(msg, field.name)
            value_field = field.message_type.fields_by_name["value"]
            for _ in range(rng.randint(0, 3)):
                key = random_text(rng)[:64]
                if value_field.message_type is None:
                    target[key] = scalar(rng, value_field)
                else:
                    fill(rng, target[key], depth + 1)
            continue
        if _is_repeated(field):
            target = getattr(msg, field.name)
            n = rng.choice((0, 1, 2, 3, rng.randint(0, _MAX_REPEATED)))
            if field.message_type is not None:
                if depth < _MAX_DEPTH:
                    for _ in range(n):
                        fill(rng, target.add(), depth + 1, presence)
            else:
                target.extend(scalar(rng, field) for _ in range(n))
            continue
        if field.message_type is not None:
            if depth < _MAX_DEPTH:
                fill(rng, getattr(msg, field.name), depth + 1, presence)
                if not getattr(msg, field.name).ListFields():
                    getattr(msg, field.name).SetInParent()
            continue
        setattr(msg, field.name, scalar(rng, field))
    return msg


def _fields_of(msg: Message, depth: int = 0) -> list[tuple[Message, D.FieldDescriptor]]:
    """Every (holder, field) pair reachable in ``msg``, so a mutation can pick any of them."""
    out = [(msg, f) for f in msg.DESCRIPTOR.fields]
    if depth >= _MAX_DEPTH:
        return out
    for field, value in msg.ListFields():
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        children = value if _is_repeated(field) else [value]
        for child in children:
            out += _fields_of(child, depth + 1)
    return out


def mutate(rng: random.Random, msg: Message, rounds: int = 1) -> Message:
    """Changes ``rounds`` fields of a (valid) message: an edge value, a dropped, doubled or
    truncated repeated field (wrong lengths of token / logprob / mask arrays), or a cleared one."""
    for _ in range(rounds):
        fields = _fields_of(msg)
        if not fields:
            return msg
        holder, field = rng.choice(fields)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            holder.ClearField(field.name)
            continue
        if _is_repeated(field):
            values = getattr(holder, field.name)
            action = rng.choice(("truncate", "extend", "clear", "edge"))
            if action == "clear" or not len(values):
                holder.ClearField(field.name)
                if field.message_type is not None:
                    fill(rng, values.add(), 1)
            elif action == "truncate":
                del values[rng.randrange(len(values)) :]
            elif action == "extend" and field.message_type is None:
                values.extend(scalar(rng, field) for _ in range(rng.randint(1, 8)))
            elif action == "extend":
                values.add().CopyFrom(values[0])
            elif field.message_type is None:
                values[rng.randrange(len(values))] = scalar(rng, field)
            continue
        if field.message_type is not None:
            if rng.random() < 0.5:
                holder.ClearField(field.name)
            else:
                fill(rng, getattr(holder, field.name), 1)
            continue
        setattr(holder, field.name, scalar(rng, field))
    return msg


def huge(rng: random.Random, msg: Message, elements: int) -> Message:
    """Grows one repeated scalar field (or, lacking one, one string) to ``elements`` items."""
    candidates = [
        (h, f) for h, f in _fields_of(msg) if f.message_type is None and (_is_repeated(f) or f.type == f.TYPE_STRING)
    ]
    if not candidates:
        return msg
    holder, field = rng.choice(candidates)
    if _is_repeated(field):
        # The count is what is huge: a random long string (70,000 characters) two million times
        # would be 140 GB in the fuzzer itself, which the OOM killer stopped.
        item = _SHORTEST.get(field.type) or scalar(rng, field)
        getattr(holder, field.name).extend([item] * elements)
    else:
        setattr(holder, field.name, "h" * elements)
    return msg


def flip_bytes(rng: random.Random, data: bytes) -> bytes:
    """A serialized message with a few bytes changed, cut short or grown: broken wire encodings."""
    if not data or rng.random() < 0.3:
        return rng.randbytes(rng.choice((1, 5, 64, 4096)))
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    if rng.random() < 0.3:
        del buf[rng.randrange(len(buf)) :]
    return bytes(buf)
