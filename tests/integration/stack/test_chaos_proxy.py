"""The chaos run's fault-injecting TCP proxy, in front of a real redis-server."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from commands.stack.chaos.proxy import ProxyFleet
from tests.waiting import wait_until


@pytest.fixture
def fleet():
    proxies = ProxyFleet()
    yield proxies
    proxies.close()


def _client(address: str) -> redis.Redis:
    host, _, port = address.rpartition(":")
    # No client-side retries: each call shows what the proxy did to it.
    return redis.Redis(host=host, port=int(port), socket_timeout=1.0, retry=Retry(NoBackoff(), 0))


def test_traffic_passes_then_latency_reset_and_partition_hit_it(redis_server, fleet):
    address = fleet.add("redis", f"127.0.0.1:{redis_server.port}")
    assert fleet.add("redis", "ignored:1") == address  # one proxy per component
    client = _client(address)
    assert client.set("k", "v") and client.get("k") == b"v"

    slow = fleet.inject("redis", "latency", seconds=1.5, latency_s=0.3)
    started = time.monotonic()
    client.get("k")
    assert time.monotonic() - started >= 0.5  # both directions delayed

    # A reset while a call is on the wire cuts it (a client may reconnect between calls unseen).
    threading.Timer(0.1, lambda: fleet.inject("redis", "reset", seconds=0)).start()
    with pytest.raises(redis.ConnectionError):
        client.get("k")
    slow.result(timeout=5)
    assert client.get("k") == b"v"  # and a new connection works

    healed = fleet.inject("redis", "partition", seconds=2.0)
    wait_until(lambda: fleet.proxies["redis"].partitioned, timeout_s=5, what="the partition to start")
    with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
        _client(address).get("k")
    healed.result(timeout=10)
    assert _client(address).get("k") == b"v"
