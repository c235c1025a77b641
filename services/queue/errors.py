"""Errors of the queue, one per gRPC status a caller may handle, on both sides of the wire.

The stores raise them and the servicer answers each with its ``code``; the client raises them
again from the status that came back (:func:`from_rpc_error`), so a caller of
:class:`services.queue.client.QueueClient` handles the very class the store raised and never
sees a gRPC error.
"""

from __future__ import annotations

import grpc

from relayrl.status_errors import StatusError, error_for_status


class QueueError(StatusError):
    """Any failure of a queue call; ``code`` is its gRPC status, ``details`` the server's message."""


class BadRequest(QueueError, ValueError):
    """A caller's argument is invalid (INVALID_ARGUMENT); the message says which and why."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class QueueFull(QueueError):
    """Capacity stayed exhausted for the whole push timeout (RESOURCE_EXHAUSTED); nothing was stored."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class QueueUnavailable(QueueError):
    """The queue could not be reached, its Redis was down (UNAVAILABLE), or it did not answer
    within the call's deadline (DEADLINE_EXCEEDED): the same call may succeed a moment later."""

    code = grpc.StatusCode.UNAVAILABLE


_BY_CODE: dict[grpc.StatusCode, type[QueueError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: BadRequest,
    grpc.StatusCode.RESOURCE_EXHAUSTED: QueueFull,
    grpc.StatusCode.UNAVAILABLE: QueueUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: QueueUnavailable,
}


def from_rpc_error(err: grpc.aio.AioRpcError) -> QueueError:
    """The queue error for a failed call's status (the base class for codes no caller handles)."""
    return error_for_status(QueueError, _BY_CODE, err.code(), err.details() or "")


def is_transient(exc: BaseException) -> bool:
    """A failure of the link rather than of the request: worth retrying with backoff."""
    return isinstance(exc, QueueUnavailable)
