"""``relayrl rollout serve`` as a process: REST control behind the bearer token, gRPC RolloutControl."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import httpx
import pytest

from relayrl import http_client
from relayrl.net import free_port
from relayrl.redis_process import RedisProcess
from relayrl.serving import grpc_channel
from relayrl.subprocesses import stop_process
from relayrl.v1 import rollout_pb2 as pb
from relayrl.v1 import rollout_pb2_grpc as pb_grpc
from services.queue.client import QueueClient
from services.queue.config import QueueSettings
from services.queue.server import QueueServer, start_queue_server
from tests.integration.rollout.conftest import REPO, EngineProcess, queue_overrides
from tests.integration.rollout.replica_harness import prompt, pull_groups
from tests.waiting import wait_until_async

TOKEN = "s3cret"


@dataclass
class RolloutProcess:
    http: httpx.AsyncClient
    grpc_address: str
    queue: QueueServer


@pytest.fixture
async def rollout(engine: EngineProcess, redis_server: RedisProcess, run_id: str) -> AsyncIterator[RolloutProcess]:
    queue = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id)))
    http_port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "RELAYRL_API_TOKEN": TOKEN,
        "RELAYRL_ROLLOUT_ENGINE_URL": engine.url,
        "RELAYRL_ROLLOUT_QUEUE_ADDRESS": queue.grpc_address,
        "RELAYRL_ROLLOUT_HTTP_PORT": str(http_port),
        "RELAYRL_ROLLOUT_GRPC_PORT": str(grpc_port),
        "RELAYRL_ROLLOUT_MAX_NEW_TOKENS": "8",
        "RELAYRL_ROLLOUT_LEASE_BLOCK_TIMEOUT_S": "0.2",
        "RELAYRL_ROLLOUT_ENGINE_CHECK_INTERVAL_S": "0.1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "commands.cli", "rollout", "serve"], cwd=REPO, env=env, stderr=subprocess.DEVNULL
    )
    http = http_client.async_client(base_url=f"http://127.0.0.1:{http_port}", timeout=10)
    try:

        async def ready() -> bool:
            try:
                return (await http.get("/readyz")).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_until_async(ready, timeout_s=30, what="rollout ready")
        yield RolloutProcess(http, f"127.0.0.1:{grpc_port}", queue)
    finally:
        await http.aclose()
        await asyncio.to_thread(stop_process, proc, 15)
        await queue.stop()
    assert proc.returncode == 0, "rollout did not stop cleanly on SIGTERM"


async def test_rest_control_needs_the_token_and_pauses_the_engine(
    rollout: RolloutProcess, engine: EngineProcess
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert (await rollout.http.get("/control/status")).status_code == 401
    assert (await rollout.http.post("/control/pause", headers={"Authorization": "Bearer wrong"})).status_code == 401
    assert (await rollout.http.post("/control/pause", json={"mode": "sideways"}, headers=auth)).status_code == 422

    paused = (await rollout.http.post("/control/pause", json={"mode": "in_place"}, headers=auth)).json()
    assert paused["paused"] and paused["pause_mode"] == "in_place"
    async with http_client.async_client(base_url=engine.url) as eng:
        assert (await eng.get("/get_model_info")).json()["paused"] == "in_place"
        async with QueueClient(rollout.queue.grpc_address) as q:
            await q.release([prompt(30)])
            # Nothing is generated while paused (a Lease call already waiting when the pause came
            # may still take the prompt; the paused engine then holds its requests).
            assert await q.pull("trainer-0", 0, 100, 1, block_timeout_s=1.0) == []
            stats = await q.prompt_stats()
            assert stats.total_completed == 0 and stats.waiting + stats.leased == 1
            resumed = (await rollout.http.post("/control/resume", headers=auth)).json()
            assert not resumed["paused"]
            assert (await eng.get("/get_model_info")).json()["paused"] is None
            (group,) = await pull_groups(rollout.queue.grpc_address, 1)
    assert group.prompt_id == "test/30"

    # The replica counts a group once the queue has acknowledged its push, a moment after
    # the queue could hand it to us.
    async def counted() -> dict | None:
        status = (await rollout.http.get("/control/status", headers=auth)).json()
        return status if status["total_generated_samples"] else None

    status = await wait_until_async(counted, timeout_s=5, what="the pushed group counted")
    assert status["total_generated_samples"] == 2 and status["engine_ready"]
    metrics = (await rollout.http.get("/metrics")).text
    assert "relayrl_rollout_total_generated_samples_total 2.0" in metrics


async def test_grpc_control_status_pause_resume_and_bad_mode(rollout: RolloutProcess) -> None:
    async with grpc_channel(rollout.grpc_address) as channel:
        stub = pb_grpc.RolloutControlStub(channel)
        status = await stub.Status(pb.StatusRequest())
        assert status.replica_id == "rollout-0" and status.engine_ready and not status.paused
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Pause(pb.PauseRequest())
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        paused = await stub.Pause(pb.PauseRequest(mode=pb.PAUSE_MODE_RETRACT))
        assert paused.paused and paused.pause_mode == "retract"
        resumed = await stub.Resume(pb.ResumeRequest())
        assert not resumed.paused
