"""Durability: with appendfsync always, a crashed and restarted redis-server keeps every accepted group."""

from __future__ import annotations

import grpc
import pytest

from relayrl.redis_process import RedisProcess
from services.queue.client import QueueClient
from services.queue.config import QueueSettings
from services.queue.errors import QueueError, QueueUnavailable
from services.queue.server import start_queue_server
from tests.waiting import wait_until_async

from .helpers import make_group


async def _pull_when_back(client: QueueClient, want: int) -> list:
    got: list = []

    async def all_back() -> bool:
        try:
            got.extend(await client.pull("trainer-0", current_version=0, max_staleness=0, max_groups=want))
        except QueueError as err:
            # While Redis restarts the service answers UNAVAILABLE and keeps serving.
            assert err.code == grpc.StatusCode.UNAVAILABLE, err
        return len(got) >= want

    await wait_until_async(all_back, 20, f"{want} groups back", poll_s=0.1)
    return got


async def test_sigkilled_redis_with_appendfsync_always_loses_no_accepted_group(tmp_path):
    redis = RedisProcess(data_dir=tmp_path / "redis", appendfsync="always").start()
    server = None
    try:
        server = await start_queue_server(QueueSettings(redis_url=redis.url, run_id="durable"))
        async with QueueClient(server.grpc_address) as client:
            accepted = []
            for i in range(0, 20, 4):
                accepted += await client.push([make_group(j) for j in range(i, i + 4)])
            redis.kill()
            redis.start()
            got = await _pull_when_back(client, len(accepted))
            assert [d.entry_id for d in got] == accepted
            assert [d.group.group_id for d in got] == [f"g{i}" for i in range(20)]
            assert (await client.stats()).total_produced == 20
    finally:
        if server is not None:
            await server.stop()
        redis.stop()


async def test_password_from_settings_and_aof_policy_applied_at_start(tmp_path):
    redis = RedisProcess(data_dir=tmp_path / "redis", password="hunter2").start()
    servers = []
    try:
        bare_url = f"redis://{redis.host}:{redis.port}/0"
        good = await start_queue_server(
            QueueSettings(redis_url=bare_url, redis_password="hunter2", redis_appendfsync="always", run_id="auth")
        )
        servers.append(good)
        async with QueueClient(good.grpc_address) as client:
            assert len(await client.push([make_group(0)])) == 1
        policy = await good.redis.config_get("appendfsync")
        assert [bytes(v, "utf8") if isinstance(v, str) else v for v in policy.values()] == [b"always"]

        wrong = await start_queue_server(QueueSettings(redis_url=bare_url, redis_password="nope", run_id="auth"))
        servers.append(wrong)
        async with QueueClient(wrong.grpc_address) as client:
            # A wrong Redis password must not serve.
            with pytest.raises(QueueUnavailable) as err:
                await client.stats()
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        for server in servers:
            await server.stop()
        redis.stop()
