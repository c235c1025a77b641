"""Protobuf wire encoding of the two hot messages, so payloads cross the service as bytes.

A ``TrajectoryGroup`` of 8 × 1024 tokens is ~65 kB; parsing it into a message, copying it
into a response and serializing it again costs more than the Redis round trip. Push keeps
each group's bytes exactly as received (it still parses them once, to validate), and Pull
splices the stored bytes into the reply. Both produce standard protobuf encodings of
``PushRequest`` / ``PullResponse`` from queue.proto; any protobuf client reads them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from relayrl.v1 import queue_pb2 as qpb
from relayrl.v1 import queue_pb2_grpc as qgrpc
from relayrl.varint import decode_varint, encode_varint
from services.queue.trajectories import PullResult

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


@dataclass(frozen=True, slots=True)
class RawPushRequest:
    """``PushRequest`` with each group left as its serialized bytes."""

    groups: list[bytes]
    timeout_s: float


def parse_push_request(data: bytes) -> RawPushRequest:
    """Splits a serialized ``PushRequest``; raises ValueError on a broken encoding."""
    groups: list[bytes] = []
    timeout_s = 0.0
    pos = 0
    while pos < len(data):
        key, pos = decode_varint(data, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == _LEN:
            size, pos = decode_varint(data, pos)
            if pos + size > len(data):
                raise ValueError("length-delimited field runs past the end of the message")
            if field == 1:
                groups.append(data[pos : pos + size])
            pos += size
        elif wire_type == _I64:
            if pos + 8 > len(data):
                raise ValueError("truncated 64-bit field")
            if field == 2:
                (timeout_s,) = struct.unpack_from("<d", data, pos)
            pos += 8
        elif wire_type == _VARINT:
            _, pos = decode_varint(data, pos)
        elif wire_type == _I32:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
    if pos != len(data):
        raise ValueError("message ends inside a field")
    return RawPushRequest(groups, timeout_s)


def _decode_push(data: bytes) -> RawPushRequest | ValueError:
    # Returned, not raised: the handler turns it into INVALID_ARGUMENT with the reason.
    try:
        return parse_push_request(data)
    except ValueError as err:
        return err


def encode_pull_response(reply: PullResult) -> bytes:
    """``PullResponse`` with each delivery's stored bytes spliced in as its ``group``."""
    # One join at the end: each payload is copied once, not once per enclosing message.
    parts: list[bytes] = []
    for d in reply.deliveries:
        head = qpb.DeliveredGroup(
            entry_id=d.entry_id, delivery_count=d.delivery_count, age_versions=d.age_versions
        ).SerializeToString()
        payload_key = encode_varint(2 << 3 | _LEN) + encode_varint(len(d.payload))
        size = len(head) + len(payload_key) + len(d.payload)
        parts += (encode_varint(1 << 3 | _LEN), encode_varint(size), head, payload_key, d.payload)
    parts.append(qpb.PullResponse(dropped_stale=reply.dropped_stale).SerializeToString())
    return b"".join(parts)


def add_trajectory_queue(servicer: qgrpc.TrajectoryQueueServicer, server: grpc.aio.Server) -> None:
    """Registers TrajectoryQueue like the generated helper, with the byte-level Push and Pull codecs."""
    codecs: dict[str, tuple[Callable, Callable]] = {
        "Push": (_decode_push, qpb.PushResponse.SerializeToString),
        "Pull": (qpb.PullRequest.FromString, encode_pull_response),
        "Ack": (qpb.AckRequest.FromString, qpb.AckResponse.SerializeToString),
        "Stats": (qpb.StatsRequest.FromString, qpb.QueueStats.SerializeToString),
        "Rollback": (qpb.RollbackRequest.FromString, qpb.RollbackResponse.SerializeToString),
    }
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name), request_deserializer=decode, response_serializer=encode
        )
        for name, (decode, encode) in codecs.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("relayrl.v1.TrajectoryQueue", handlers),))
    server.add_registered_method_handlers("relayrl.v1.TrajectoryQueue", handlers)
