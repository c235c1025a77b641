"""In-cluster replica discovery end to end: `relayrl paramsync serve` with RELAYRL_PARAMSYNC_DISCOVERY=kubernetes
finds a built-in engine through the rollout Service's EndpointSlice (served by the stand-in API
server, reached through a kubeconfig as a real client would) and pushes it the latest version
over the distributed transport; when the endpoint goes, the replica leaves the version table."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import yaml

from relayrl import http_client
from relayrl.models.loading import load_causal_lm
from relayrl.models.tiny import TinyModelSpec, init_tiny
from relayrl.net import free_port, wait_for_port
from relayrl.subprocesses import stop_process
from services.engine.client import EngineClient
from services.paramsync.client import ParamSyncClient
from tests.integration.deploy._fakes import FakeKubeAPI, endpoint_slice
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]
SERVICE = "rl-relayrl-rollout"


def child_env(**env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RELAYRL_")}
    return {**base, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **env}


@contextlib.contextmanager
def process(args: list[str], log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "commands.cli", *args], env=env, cwd=REPO, stdout=out, stderr=out
        )
        try:
            yield proc
        finally:
            stop_process(proc, 15)


def kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig for the stand-in API server, as `kubectl config` would write it."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "fake", "user": {"token": "unused"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "rl"}}],
                "current-context": "fake",
            }
        )
    )
    return path


async def replica_rows(address: str) -> dict[str, int]:
    async with ParamSyncClient(address) as client:
        table = await client.list_replicas()
    return {row.replica_id: row.version for row in table.replicas}


async def engine_version(url: str) -> str:
    async with EngineClient(url) as engine:
        return await engine.weight_version()


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    server = FakeKubeAPI(namespace="rl").start()
    yield server
    server.stop()


def test_a_replica_added_to_the_endpointslice_receives_the_latest_version(
    api: FakeKubeAPI, tiny_model_dir: Path, tmp_path: Path
) -> None:
    torch.set_num_threads(1)
    engine_port, grpc_port, http_port = free_port(), free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    # The rollout Service exists but no replica is ready yet.
    api.put(endpoint_slice("rollout-x1", SERVICE, {}, namespace="rl", engine_port=engine_port))
    engine_args = ["engine", "serve", "--model", str(tiny_model_dir), "--port", str(engine_port)]
    paramsync_env = child_env(
        KUBECONFIG=str(kubeconfig(tmp_path / "kubeconfig", api.url)),
        RELAYRL_PARAMSYNC_DISCOVERY="kubernetes",
        RELAYRL_PARAMSYNC_K8S_NAMESPACE="rl",
        RELAYRL_PARAMSYNC_K8S_LABEL_SELECTOR=f"kubernetes.io/service-name={SERVICE}",
        RELAYRL_PARAMSYNC_TRANSPORT="distributed",
        RELAYRL_PARAMSYNC_SYNC_TIMEOUT="60",
        RELAYRL_PARAMSYNC_GRPC_PORT=str(grpc_port),
        RELAYRL_PARAMSYNC_HTTP_PORT=str(http_port),
    )
    engine_env = child_env(RELAYRL_ENGINE_TORCH_THREADS="1")
    with (
        process(engine_args, tmp_path / "engine.log", engine_env),
        process(["paramsync", "serve"], tmp_path / "paramsync.log", paramsync_env),
    ):
        wait_for_port("127.0.0.1", grpc_port, 60)
        address = f"127.0.0.1:{grpc_port}"
        wait_until(lambda: _healthy(engine_url), 60, "the engine", poll_s=0.2)
        assert asyncio.run(engine_version(engine_url)) == "0"

        # The trainer publishes version 1 while paramsync knows no replica.
        policy = load_causal_lm(init_tiny(tmp_path / "policy-v1", TinyModelSpec(seed=1234)))

        async def publish() -> None:
            async with ParamSyncClient(address) as client:
                await client.publish(1, policy.state_dict(), trainer_step=1)

        asyncio.run(publish())
        assert asyncio.run(replica_rows(address)) == {}

        # The rollout pod turns ready: its endpoint appears in the slice, and paramsync pushes v1 to it.
        pod = "rl-relayrl-rollout-6d4f9-abcde"
        api.put(endpoint_slice("rollout-x1", SERVICE, {pod: "127.0.0.1"}, namespace="rl", engine_port=engine_port))
        wait_until(
            lambda: asyncio.run(replica_rows(address)).get(pod) == 1, 90, "the new replica at version 1", poll_s=0.2
        )
        assert asyncio.run(engine_version(engine_url)) == "1"

        # The pod goes away: its row leaves the version table.
        api.put(endpoint_slice("rollout-x1", SERVICE, {}, namespace="rl", engine_port=engine_port))
        wait_until(lambda: asyncio.run(replica_rows(address)) == {}, 30, "the replica to leave the table", poll_s=0.2)
        assert any(q.get("watch") == ["true"] for q in api.requests)  # it watched, not polled


def _healthy(url: str) -> bool:
    try:
        return http_client.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
