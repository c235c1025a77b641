"""`relayrl queue serve` as a real process: env settings, probes, serving, clean SIGTERM, bad settings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import redis

from relayrl import http_client
from relayrl.net import free_port
from services.queue.client import QueueClient
from tests.waiting import wait_until

from .helpers import make_group


def _ready(url: str, proc: subprocess.Popen) -> bool:
    assert proc.poll() is None, "queue service exited during start-up"
    try:
        return http_client.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


async def test_serve_from_env_answers_and_stops_on_sigterm(redis_server):
    grpc_port, http_port = free_port(), free_port()
    env = {
        **os.environ,
        "RELAYRL_REDIS_URL": redis_server.url,
        "RELAYRL_RUN_ID": "cli",
        "RELAYRL_QUEUE_GRPC_PORT": str(grpc_port),
        "RELAYRL_QUEUE_HTTP_PORT": str(http_port),
    }
    proc = subprocess.Popen([sys.executable, "-m", "commands.cli", "queue", "serve"], env=env, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: _ready(f"http://127.0.0.1:{http_port}/readyz", proc), 30, "the queue service to be ready")
        async with QueueClient(f"127.0.0.1:{grpc_port}") as client:
            await client.push([make_group(0)])
            assert (await client.stats()).total_produced == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    # Keys are namespaced by RELAYRL_RUN_ID.

    assert redis.Redis.from_url(redis_server.url).xlen("relayrl:cli:trajectories") == 1


def test_bad_setting_fails_at_start_naming_the_variable():
    env = {**os.environ, "RELAYRL_QUEUE_CAPACITY": "zero"}
    out = subprocess.run(
        [sys.executable, "-m", "commands.cli", "queue", "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert "RELAYRL_QUEUE_CAPACITY" in out.stderr


async def test_readyz_reports_redis_down(start_queue, redis_server):
    server = await start_queue()
    async with http_client.async_client(base_url=f"http://127.0.0.1:{server.http.port}") as http:
        assert (await http.get("/readyz")).status_code == 200
        redis_server.stop()
        assert (await http.get("/readyz")).status_code == 503
        assert (await http.get("/healthz")).status_code == 200
