"""One way to retry a call across every link: tenacity, a per-transport notion of a transient
failure, a bound in attempts or in seconds, and one log line per retry.

A link decides *what* is worth retrying (a failure of the link, not of the request) with one of
the predicates here (``grpc_transient``, ``http_transient``, ``redis_transient``, ``any_error``) or its own; the
policy decides *how long*. Callers write::

    async for attempt in retrying("fetch v3 from paramsync", grpc_transient, policy):
        with attempt:
            return await stub.Fetch(...)

or ``await call_with_retries(...)``. The last error is re-raised unchanged once the policy is spent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import grpc

if TYPE_CHECKING:
    from tenacity import AsyncRetrying, RetryCallState, Retrying
    from tenacity.stop import stop_base

# tenacity, httpx and redis are imported where a retry runs or an error of theirs is classified, not
# here: the trainer imports this module for its feed, and its non-serving paths (a benchmark, sft)
# need none of them.

log = logging.getLogger(__name__)

T = TypeVar("T")

Transient = Callable[[BaseException], bool]

# Failures of the link rather than of the request: the same call may succeed a moment later.
GRPC_TRANSIENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
HTTP_TRANSIENT_STATUS = frozenset({502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying: ``attempts`` tries in all (1 = no retry) and/or ``deadline_s``
    seconds from the first try, whichever ends first; neither means until it succeeds."""

    attempts: int | None = 3
    deadline_s: float | None = None
    first_wait_s: float = 0.1
    max_wait_s: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError(f"RetryPolicy.deadline_s must be positive, got {self.deadline_s}")


def grpc_transient(exc: BaseException) -> bool:
    """UNAVAILABLE or DEADLINE_EXCEEDED from a gRPC call."""
    return (
        isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)) and exc.code() in GRPC_TRANSIENT_CODES
    )


def http_transient(exc: BaseException) -> bool:
    """A connection that failed or dropped, or a 502/503/504 answer."""
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in HTTP_TRANSIENT_STATUS
    return isinstance(exc, httpx.TransportError)


def redis_transient(exc: BaseException) -> bool:
    """Redis unreachable, timed out, or still loading its AOF after a restart."""
    import redis.exceptions

    return isinstance(
        exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.BusyLoadingError)
    )


def any_error(exc: BaseException) -> bool:
    """Every error is worth another try, for loops that must outlive any failure of their peer
    (cancellation and interpreter exits are not errors)."""
    return isinstance(exc, Exception)


def _stop(policy: RetryPolicy) -> stop_base:
    from tenacity import stop_after_attempt, stop_after_delay, stop_any, stop_never

    stops = []
    if policy.attempts is not None:
        stops.append(stop_after_attempt(policy.attempts))
    if policy.deadline_s is not None:
        stops.append(stop_after_delay(policy.deadline_s))
    return stop_any(*stops) if stops else stop_never


def _log_retry(what: str, logger: logging.Logger) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait_s = state.next_action.sleep if state.next_action else 0.0
        logger.warning("%s: attempt %d failed (%r); retrying in %.2fs", what, state.attempt_number, exc, wait_s)

    return before_sleep


def _kwargs(what: str, transient: Transient, policy: RetryPolicy, logger: logging.Logger) -> dict:
    from tenacity import retry_if_exception, wait_exponential

    return {
        "stop": _stop(policy),
        "wait": wait_exponential(multiplier=policy.first_wait_s, min=policy.first_wait_s, max=policy.max_wait_s),
        "retry": retry_if_exception(transient),
        "before_sleep": _log_retry(what, logger),
        "reraise": True,
    }


def retrying(what: str, transient: Transient, policy: RetryPolicy, logger: logging.Logger = log) -> AsyncRetrying:
    """An ``async for attempt in ...`` loop over tries of ``what`` (named in the retry log line)."""
    from tenacity import AsyncRetrying

    return AsyncRetrying(**_kwargs(what, transient, policy, logger))


def retrying_sync(
    what: str,
    transient: Transient,
    policy: RetryPolicy,
    logger: logging.Logger = log,
    sleep: Callable[[float], object] = time.sleep,
) -> Retrying:
    """The blocking form of :func:`retrying`, for threads and synchronous clients; a thread that
    must stop promptly passes ``sleep=stop_event.wait`` so a stop cuts the wait short."""
    from tenacity import Retrying

    return Retrying(sleep=sleep, **_kwargs(what, transient, policy, logger))


async def call_with_retries(
    what: str,
    call: Callable[[], Awaitable[T]],
    transient: Transient,
    policy: RetryPolicy,
    logger: logging.Logger = log,
) -> T:
    """``await call()`` until it succeeds, fails with a non-transient error, or the policy is spent."""
    async for attempt in retrying(what, transient, policy, logger):
        with attempt:
            return await call()
    raise AssertionError("unreachable: tenacity returns or re-raises")


def call_with_retries_sync(
    what: str, call: Callable[[], T], transient: Transient, policy: RetryPolicy, logger: logging.Logger = log
) -> T:
    """The blocking form of :func:`call_with_retries`."""
    for attempt in retrying_sync(what, transient, policy, logger):
        with attempt:
            return call()
    raise AssertionError("unreachable: tenacity returns or re-raises")
