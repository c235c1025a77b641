"""The shared retry helper: what is retried, for how long, and what each retry logs."""

from __future__ import annotations

import logging

import grpc
import httpx
import pytest
import redis.exceptions

from relayrl.retry import (
    RetryPolicy,
    call_with_retries,
    call_with_retries_sync,
    grpc_transient,
    http_transient,
    redis_transient,
)


class _Rpc(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


def _flaky(failures: list[BaseException]):
    calls = {"n": 0}

    def call() -> str:
        calls["n"] += 1
        if failures:
            raise failures.pop(0)
        return "ok"

    return call, calls


def test_transient_failures_are_retried_and_each_retry_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    call, calls = _flaky([_Rpc(grpc.StatusCode.UNAVAILABLE), _Rpc(grpc.StatusCode.DEADLINE_EXCEEDED)])
    policy = RetryPolicy(attempts=5, first_wait_s=0.001, max_wait_s=0.001)
    with caplog.at_level(logging.WARNING, logger="relayrl.retry"):
        assert call_with_retries_sync("push to queue", call, grpc_transient, policy) == "ok"
    assert calls["n"] == 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert all(line.startswith("push to queue: attempt") for line in lines)


def test_a_request_error_is_raised_at_once() -> None:
    call, calls = _flaky([_Rpc(grpc.StatusCode.INVALID_ARGUMENT)])
    with pytest.raises(_Rpc):
        call_with_retries_sync("push", call, grpc_transient, RetryPolicy(attempts=5, first_wait_s=0.001))
    assert calls["n"] == 1


def test_attempts_bound_the_tries_and_the_last_error_is_raised_unchanged() -> None:
    last = _Rpc(grpc.StatusCode.UNAVAILABLE)
    call, calls = _flaky([_Rpc(grpc.StatusCode.UNAVAILABLE), _Rpc(grpc.StatusCode.UNAVAILABLE), last])
    with pytest.raises(_Rpc) as raised:
        call_with_retries_sync("push", call, grpc_transient, RetryPolicy(attempts=3, first_wait_s=0.001))
    assert raised.value is last
    assert calls["n"] == 3


async def test_a_deadline_bounds_the_async_tries() -> None:
    tries = {"n": 0}

    async def never() -> None:
        tries["n"] += 1
        raise httpx.ConnectError("refused")

    policy = RetryPolicy(attempts=None, deadline_s=0.3, first_wait_s=0.05, max_wait_s=0.05)
    with pytest.raises(httpx.ConnectError):
        await call_with_retries("resume engine", never, http_transient, policy)
    assert 2 <= tries["n"] <= 10


def test_each_transport_names_its_transient_failures() -> None:
    assert grpc_transient(_Rpc(grpc.StatusCode.UNAVAILABLE))
    assert not grpc_transient(_Rpc(grpc.StatusCode.NOT_FOUND))
    request = httpx.Request("GET", "http://engine/health")
    assert http_transient(httpx.ConnectError("refused", request=request))
    assert http_transient(httpx.HTTPStatusError("busy", request=request, response=httpx.Response(503)))
    assert not http_transient(httpx.HTTPStatusError("bad", request=request, response=httpx.Response(400)))
    assert redis_transient(redis.exceptions.BusyLoadingError("loading"))
    assert redis_transient(redis.exceptions.ConnectionError("refused"))
    assert not redis_transient(redis.exceptions.ResponseError("WRONGTYPE"))


def test_a_policy_without_tries_is_refused() -> None:
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)
