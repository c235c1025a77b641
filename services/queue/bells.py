"""Wake-ups instead of polling: a Redis pub/sub message rings a bell when a waiter may proceed.

A Lease with nothing to hand out waits for a release, a give-back or the earliest lease expiry;
a Push at capacity waits for an ack or a drop to free room. Each such change publishes on its
channel in the same transaction or script as the change, and every queue service instance
listens on one connection and wakes its own waiters, so several instances behind one Service
wake each other. A message missed while the connection was down only delays a waiter until
its fallback re-check (``poll_interval_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import redis.asyncio as aioredis

log = logging.getLogger(__name__)

RECONNECT_S = 1.0


class Bells:
    """One asyncio event per channel, replaced each time it rings, so no ring is missed.

    A waiter takes :meth:`waiter` *before* checking Redis; a ring between that check and its
    wait has set the event it holds.
    """

    def __init__(self, redis: aioredis.Redis, channels: Sequence[str]) -> None:
        self._redis = redis
        self._events = {channel: asyncio.Event() for channel in channels}

    def waiter(self, channel: str) -> asyncio.Event:
        return self._events[channel]

    def ring(self, channel: str) -> None:
        event, self._events[channel] = self._events[channel], asyncio.Event()
        event.set()

    async def listen(self, stopping: asyncio.Event) -> None:
        """Rings the bells as messages arrive, reconnecting until ``stopping`` is set."""
        while not stopping.is_set():
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*self._events)
                while not stopping.is_set():
                    message = await pubsub.get_message(timeout=RECONNECT_S)
                    if message is not None:
                        self.ring(message["channel"].decode())
            except Exception as err:  # Redis down or restarting: waiters fall back to re-checking
                log.debug("bell subscription lost (%s); reconnecting", err)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), RECONNECT_S)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()


async def wait_for_ring(event: asyncio.Event, timeout_s: float) -> None:
    """Returns when ``event`` rings or after ``timeout_s``, whichever is first."""
    if timeout_s > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)
