"""A request that does not decode gets INVALID_ARGUMENT naming the message type and the reason.

grpc's server answers a deserializer's exception with UNKNOWN and no hint of the cause; this
interceptor, installed on every RelayRL gRPC server, turns it into a clear client error.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc


@dataclass(frozen=True)
class _Undecodable:
    reason: str


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:
            return _Undecodable(f"{type(exc).__name__}: {exc}")

    return decode


async def _refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, _Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request does not decode: {request.reason}")


def _guard_single(behavior: Callable) -> Callable:
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await _refuse(request, context)
            async for item in behavior(request, context):
                yield item

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _refuse(request, context)
        return await behavior(request, context)

    return unary


def _guard_stream(behavior: Callable) -> Callable:
    async def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for request in requests:
            await _refuse(request, context)
            yield request

    if inspect.isasyncgenfunction(behavior):

        async def stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for item in behavior(checked(requests, context), context):
                yield item

        return stream

    async def unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await behavior(checked(requests, context), context)

    return unary


class UndecodableRequests(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        changes: dict[str, Any] = {"request_deserializer": _safe(handler.request_deserializer)}
        for kind in ("unary_unary", "unary_stream"):
            if getattr(handler, kind) is not None:
                changes[kind] = _guard_single(getattr(handler, kind))
        for kind in ("stream_unary", "stream_stream"):
            if getattr(handler, kind) is not None:
                changes[kind] = _guard_stream(getattr(handler, kind))
        return handler._replace(**changes)
