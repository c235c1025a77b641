"""Fixtures of the queue service's integration tests: a real redis-server, real servers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from relayrl.redis_process import RedisProcess
from services.queue.config import QueueSettings
from services.queue.server import QueueServer, start_queue_server

StartQueue = Callable[..., Awaitable[QueueServer]]


@pytest.fixture
def queue_settings(redis_server: RedisProcess) -> Callable[..., QueueSettings]:
    run_id = f"t{uuid.uuid4().hex[:8]}"

    def build(**overrides: Any) -> QueueSettings:
        values: dict[str, Any] = {
            "redis_url": redis_server.url,
            "run_id": run_id,
            "consumer_idle_timeout_s": 1.0,
            # The longest fallback re-check: blocked leases and pushes must be woken by the bells.
            "poll_interval_s": 5.0,
            "stats_refresh_s": 0.2,
        }
        values.update(overrides)
        return QueueSettings(**values)

    return build


@pytest.fixture
async def start_queue(queue_settings: Callable[..., QueueSettings]) -> AsyncIterator[StartQueue]:
    """Starts in-process queue servers against the test's redis-server; stops them afterwards."""
    servers: list[QueueServer] = []

    async def start(**overrides: Any) -> QueueServer:
        server = await start_queue_server(queue_settings(**overrides))
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def raw_redis(redis_server: RedisProcess) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()
