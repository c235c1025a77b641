"""Waiting on a condition instead of sleeping: one helper for blocking and asyncio tests."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

POLL_S = 0.05


class WaitTimeout(AssertionError):
    """The condition did not hold in time; the message names it and the last value seen."""


def _timed_out(what: str, timeout_s: float, last: Any) -> WaitTimeout:
    return WaitTimeout(f"timed out after {timeout_s:.0f}s waiting for {what} (last value: {last!r})")


def wait_until(
    predicate: Callable[[], Any], timeout_s: float = 20.0, what: str = "condition", poll_s: float = POLL_S
) -> Any:
    """Calls ``predicate`` until it returns something truthy, and returns that."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, value)
        time.sleep(poll_s)


async def wait_until_async(
    predicate: Callable[[], Any], timeout_s: float = 20.0, what: str = "condition", poll_s: float = POLL_S
) -> Any:
    """The asyncio form: ``predicate`` may be a plain function or return an awaitable."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, value)
        await asyncio.sleep(poll_s)
