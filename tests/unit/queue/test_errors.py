"""The queue client raises one error class per status a caller handles, never a gRPC error."""

from __future__ import annotations

import grpc
import pytest

from services.queue.errors import BadRequest, QueueError, QueueFull, QueueUnavailable, from_rpc_error, is_transient


def _rpc_error(code: grpc.StatusCode, details: str = "why") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, BadRequest),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, QueueFull),
        (grpc.StatusCode.UNAVAILABLE, QueueUnavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, QueueUnavailable),
        (grpc.StatusCode.INTERNAL, QueueError),
    ],
)
def test_each_status_becomes_its_error_and_keeps_code_and_details(code, cls):
    err = from_rpc_error(_rpc_error(code, "the server's words"))
    assert type(err) is cls
    assert err.code == code and err.details == "the server's words" and str(err) == "the server's words"


def test_only_an_unreachable_or_silent_queue_is_worth_retrying():
    assert is_transient(from_rpc_error(_rpc_error(grpc.StatusCode.UNAVAILABLE)))
    assert is_transient(from_rpc_error(_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED)))
    assert not is_transient(from_rpc_error(_rpc_error(grpc.StatusCode.INVALID_ARGUMENT)))
    assert not is_transient(_rpc_error(grpc.StatusCode.UNAVAILABLE))  # the client never lets these out


def test_a_store_error_carries_the_status_the_servicer_answers_with():
    assert BadRequest("no prompts").code == grpc.StatusCode.INVALID_ARGUMENT
    assert QueueFull("full").code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert isinstance(BadRequest("x"), ValueError)
