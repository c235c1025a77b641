"""gRPC fuzzing of one service: every method gets random, mutated, huge and raw-byte requests.

Requests travel as bytes through a generic channel (identity serializers), so a broken wire
encoding reaches the server exactly as built. Every call must end within its deadline, in OK
or in a status that names the problem (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...) with a
message; UNKNOWN and INTERNAL mean a handler let an exception escape.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf import descriptor as D
from google.protobuf import message_factory
from google.protobuf.message import Message

from commands.fuzz import messages as M
from commands.fuzz.report import Tally
from relayrl.serving import GRPC_CHANNEL_OPTIONS

# Statuses that tell the caller what was wrong with its call (or that the service is busy).
CLEAR_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.DATA_LOSS,
    }
)
# A request asks the server to wait up to this long at most (the templates' and most random
# waits are shorter); the call's deadline leaves room for the reply above it.
DEADLINE_S = 10.0
# Server streams that legitimately stay open with nothing to say (a subscription).
OPEN_STREAMS = frozenset({"/relayrl.v1.ParamSync/Subscribe"})
OPEN_STREAM_DEADLINE_S = 1.0
# Request fields that ask the server to block; a call that asked for longer than the deadline
# and ran out of it did what was asked (the server caps the wait, e.g. max_block_timeout_s).
WAIT_FIELDS = ("block_timeout_s", "timeout_s")
CLIENT_WRITE_RACE = (grpc.StatusCode.INTERNAL, "Internal error from Core")
# Messages of a stream read before the call is cancelled: enough to see the stream works.
STREAM_READ = 4
HUGE_ELEMENTS = 2_000_000

Template = Callable[[random.Random], list[Message]]


@dataclass(frozen=True)
class Method:
    path: str
    request: type[Message]
    client_stream: bool
    server_stream: bool
    # Valid requests (a list: the messages of a client stream) the mutations start from.
    template: Template


def methods_of(service: D.ServiceDescriptor, templates: dict[str, Template]) -> list[Method]:
    out = []
    for m in service.methods:
        request = message_factory.GetMessageClass(m.input_type)
        template = templates.get(m.name, lambda _rng, cls=request: [cls()])
        out.append(Method(f"/{service.full_name}/{m.name}", request, m.client_streaming, m.server_streaming, template))
    return out


def build_request(rng: random.Random, method: Method) -> tuple[str, list[bytes]]:
    """One request (kind, serialized messages): valid, random, mutated, huge or raw bytes."""
    roll = rng.random()
    if roll < 0.1:
        kind, msgs = "valid", method.template(rng)
    elif roll < 0.35:
        kind = "random"
        msgs = [M.fill(rng, method.request()) for _ in range(rng.randint(1, 3) if method.client_stream else 1)]
    elif roll < 0.8:
        kind, msgs = "mutated", method.template(rng)
        target = rng.randrange(len(msgs))
        M.mutate(rng, msgs[target], rounds=rng.randint(1, 3))
    elif roll < 0.82:
        kind, msgs = "huge", method.template(rng)
        M.huge(rng, msgs[rng.randrange(len(msgs))], HUGE_ELEMENTS)
    else:
        kind = "bytes"
        data = [m.SerializeToString() for m in method.template(rng)]
        target = rng.randrange(len(data))
        data[target] = M.flip_bytes(rng, data[target])
        return kind, data
    return kind, [m.SerializeToString() for m in msgs]


async def _call(channel: grpc.aio.Channel, method: Method, payload: list[bytes]) -> None:
    """Makes the call; raises grpc.aio.AioRpcError for any non-OK status."""
    if method.client_stream:
        call = channel.stream_unary(method.path)

        async def requests():
            for p in payload:
                yield p

        await call(requests(), timeout=DEADLINE_S)
        return
    if not method.server_stream:
        await channel.unary_unary(method.path)(payload[0], timeout=DEADLINE_S)
        return
    # A subscription with nothing to announce stays open: a short deadline ends it sooner.
    deadline = OPEN_STREAM_DEADLINE_S if method.path in OPEN_STREAMS else DEADLINE_S
    stream = channel.unary_stream(method.path)(payload[0], timeout=deadline)
    read = 0
    try:
        async for _ in stream:
            read += 1
            if read >= STREAM_READ or method.path in OPEN_STREAMS:
                break
    finally:
        stream.cancel()


def _asked_to_wait(method: Method, payload: list[bytes]) -> bool:
    """Whether the request asked the server to block past the call's deadline (Pull, Lease, Push)."""
    try:
        request = method.request.FromString(payload[0])
    except Exception:
        return False
    fields = request.DESCRIPTOR.fields_by_name
    return any(getattr(request, name) >= DEADLINE_S - 1 for name in WAIT_FIELDS if name in fields)


def classify(tally: Tally, method: Method, kind: str, payload: list[bytes], error: grpc.aio.AioRpcError | None) -> None:
    tally.calls += 1
    code = grpc.StatusCode.OK if error is None else error.code()
    if error is not None and method.client_stream and (code, error.details()) == CLIENT_WRITE_RACE:
        # grpc/grpc#36066: the asyncio client replaces the status of a server that ended the
        # stream early (an abort on the first bad message) with this one when its next write fails.
        tally.by_status["INTERNAL_CLIENT_WRITE_RACE"] += 1
        return
    tally.by_status[code.name] += 1
    if error is None:
        return
    where = f"{method.path} ({kind}): {code.name} {error.details()!r}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        if method.path not in OPEN_STREAMS and not _asked_to_wait(method, payload):
            tally.fail("hangs", where)
    elif code not in CLEAR_CODES or not (error.details() or "").strip():
        tally.fail("unexplained", where)


async def fuzz_methods(
    address: str, methods: list[Method], calls: int, seed: int, tally: Tally, concurrency: int = 8
) -> None:
    """``calls`` requests spread over ``methods``, ``concurrency`` at a time."""
    rng = random.Random(seed)
    # Each call gets its own seed, and is built only when sent: huge requests are not all held at once.
    plan = [(methods[i % len(methods)], rng.getrandbits(64)) for i in range(calls)]
    rng.shuffle(plan)
    queue: asyncio.Queue = asyncio.Queue()
    for item in plan:
        queue.put_nowait(item)
    async with grpc.aio.insecure_channel(address, options=GRPC_CHANNEL_OPTIONS) as channel:

        async def worker() -> None:
            while not queue.empty():
                method, call_seed = queue.get_nowait()
                kind, payload = build_request(random.Random(call_seed), method)
                try:
                    await _call(channel, method, payload)
                    classify(tally, method, kind, payload, None)
                except grpc.aio.AioRpcError as err:
                    classify(tally, method, kind, payload, err)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
