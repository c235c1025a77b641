"""Reading a figure off a service's /metrics, as the demo's progress line and `bench e2e` do."""

import asyncio

import pytest
from pydantic import SecretStr

from commands.stack.progress import read_samples, scrape
from relayrl.http_app import create_http_app
from relayrl.metrics import ServiceMetrics
from relayrl.net import free_port
from relayrl.serving import start_http_server


async def test_scrape_reads_counters_and_gauges_and_tolerates_absence():
    metrics = ServiceMetrics("rollout")
    metrics.counter("generation_busy", "Busy seconds.", unit="seconds").inc(2.5)
    depth = metrics.gauge("queue_size", "Depth.", unit="groups", labels=["stream"])
    depth.labels("a").set(3)
    depth.labels("b").set(4)
    server = await start_http_server(create_http_app("rollout", metrics, lambda: True, SecretStr("")), "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.port}"
        assert await asyncio.to_thread(scrape, url, "relayrl_rollout_generation_busy_seconds") == 2.5
        assert await asyncio.to_thread(scrape, url, "relayrl_rollout_queue_size_groups") == 7
        assert await asyncio.to_thread(scrape, url, "relayrl_rollout_nothing") is None
        samples = await asyncio.to_thread(read_samples, url)
        assert samples["relayrl_rollout_generation_busy_seconds_total"] == 2.5
        assert samples["relayrl_rollout_queue_size_groups"] == 7
    finally:
        await server.stop()
    down = f"http://127.0.0.1:{free_port()}"
    assert scrape(down, "relayrl_rollout_generation_busy_seconds") is None
    # The bench's figures must not read a service that did not answer as zero.
    with pytest.raises(RuntimeError, match=f"could not read {down}/metrics"):
        read_samples(down, timeout_s=1.0)
