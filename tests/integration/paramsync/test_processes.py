"""Paramsync with real trainer and replica processes: kills, restarts, silent replicas, the serve command."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import torch
from safetensors.torch import load_file

from relayrl import http_client
from services.paramsync.client import ParamSyncClient
from services.paramsync.errors import ParamSyncError, VersionUnavailable
from tests.integration.paramsync.harness import REPO, python_env, running_service, serve_process, stop
from tests.waiting import wait_until_async

HERE = Path(__file__).parent


def weights(version: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((256,), float(version)), "b": torch.arange(version + 1, dtype=torch.int32)}


def start_replica(address: str, replica_id: str, state_dir: Path) -> subprocess.Popen[bytes]:
    state_dir.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, str(HERE / "replica_proc.py"), address, replica_id, str(state_dir)],
        env=python_env(),
        cwd=REPO,
        stderr=open(state_dir / "stderr.log", "ab"),
    )


async def table_of(ps: ParamSyncClient) -> dict[str, object]:
    return {r.replica_id: r for r in (await ps.list_replicas()).replicas}


@pytest.mark.parametrize("path", ["grpc", "dataplane"])
async def test_a_trainer_killed_mid_upload_leaves_the_previous_version_served(path):
    async with running_service() as (address, service), ParamSyncClient(address, max_sync_retries=0) as ps:
        await ps.publish(1, weights(1))
        trainer = subprocess.Popen(
            [sys.executable, str(HERE / "stalled_trainer.py"), address, "2", path],
            env=python_env(),
            cwd=REPO,
            stdout=subprocess.PIPE,
        )
        try:
            assert await asyncio.to_thread(trainer.stdout.readline) == b"HALF\n"
            announcements = ps.subscribe("watcher", held_version=1)
            assert (await asyncio.wait_for(anext(announcements), 10)).version == 2  # the upload is under way
            trainer.kill()  # SIGKILL: no goodbye on the stream
            trainer.wait(10)
        finally:
            stop(trainer)
            trainer.stdout.close()

        async def aborted() -> bool:
            try:
                await ps.fetch(2)
            except VersionUnavailable:
                return True
            except ParamSyncError as err:
                # A data-plane fetch cut when the upload failed under it: the next one is refused.
                assert err.code == grpc.StatusCode.UNAVAILABLE, err
            return False

        await wait_until_async(aborted, what="the half upload to be dropped")
        registry = service.metrics.service.registry

        def failures(reason: str) -> float:
            return registry.get_sample_value("relayrl_paramsync_publish_failures_total", {"reason": reason}) or 0.0

        # A stream cut by SIGKILL ends early or is cancelled, depending on which the server sees first.
        assert failures("incomplete") + failures("disconnected") == 1
        fetched = await ps.fetch_version(0)
        assert fetched.manifest.version == 1 and torch.equal(fetched.tensors["w"], weights(1)["w"])
        assert (await ps.list_replicas()).latest_version == 1
        # A restarted trainer publishes version 2 in full.
        assert (await ps.publish(2, weights(2))).bytes_received > 0


async def test_a_restarted_replica_catches_up_to_the_latest_version(tmp_path):
    async with running_service() as (address, _), ParamSyncClient(address) as ps:
        await ps.publish(1, weights(1))
        replica = start_replica(address, "rollout-0", tmp_path / "r0")
        try:

            async def holds(version: int):
                row = (await table_of(ps)).get("rollout-0")
                return row is not None and row.version == version and row.state == "in_sync"

            await wait_until_async(lambda: holds(1), what="rollout-0 at version 1")
            replica.kill()
            replica.wait(10)
            await ps.publish(2, weights(2))
            await ps.publish(3, weights(3))
            assert (await table_of(ps))["rollout-0"].lag_versions == 2

            replica = start_replica(address, "rollout-0", tmp_path / "r0")
            await wait_until_async(lambda: holds(3), what="rollout-0 at version 3 after restart")
        finally:
            stop(replica)
        # It went straight to the latest version and holds exactly its bytes.
        assert (tmp_path / "r0" / "fetched.log").read_text().split() == ["1", "3"]
        held = load_file(str(tmp_path / "r0" / "weights.safetensors"))
        assert all(torch.equal(held[k], weights(3)[k]) for k in held)


async def test_a_replica_that_never_answers_is_marked_lagging_while_the_others_sync(tmp_path):
    settings = dict(
        static_replicas="ghost=http://127.0.0.1:9,rollout-a=,rollout-b=",
        sync_timeout=0.5,
        max_sync_retries=1,
        sync_retry_delay=0.1,
    )
    async with running_service(**settings) as (address, service), ParamSyncClient(address) as ps:
        replicas = [start_replica(address, rid, tmp_path / rid) for rid in ("rollout-a", "rollout-b")]
        try:
            await ps.publish(1, weights(1))

            async def settled():
                table = await table_of(ps)
                states = {rid: row.state for rid, row in table.items()}
                return table if states == {"ghost": "lagging", "rollout-a": "in_sync", "rollout-b": "in_sync"} else None

            table = await wait_until_async(settled, what="ghost lagging, the others in sync")
            for rid in ("rollout-a", "rollout-b"):
                assert table[rid].version == 1 and table[rid].state == "in_sync"
            ghost = table["ghost"]
            assert ghost.version == 0 and ghost.lag_versions == 1 and "did not report version 1" in ghost.last_error
        finally:
            for proc in replicas:
                stop(proc)
        metrics = service.metrics.service.render()[0].decode()
        assert 'relayrl_paramsync_replica_lag_versions{replica="ghost"} 1.0' in metrics
        assert 'relayrl_paramsync_replica_version{replica="rollout-a"} 1.0' in metrics
        assert "relayrl_paramsync_replicas_lagging 1.0" in metrics
        assert 'relayrl_paramsync_sync_failures_total{reason="timeout"}' in metrics


async def test_disk_transport_announces_a_safetensors_directory(tmp_path):
    async with (
        running_service(transport="disk", shared_dir=str(tmp_path / "shared"), keep_versions=1) as (
            address,
            _,
        ),
        ParamSyncClient(address) as ps,
    ):
        announcements = ps.subscribe("r0")
        await ps.publish(1, weights(1))
        first = await asyncio.wait_for(anext(announcements), 10)
        await ps.publish(2, weights(2))
        second = await asyncio.wait_for(anext(announcements), 10)
        assert (first.version, second.version) == (1, 2) and second.transport == "disk"
        loaded = load_file(str(Path(second.disk_path) / "model.safetensors"))
        assert torch.equal(loaded["w"], weights(2)["w"]) and torch.equal(loaded["b"], weights(2)["b"])
        # keep_versions=1 keeps one spare directory for replicas still loading the previous one.
        assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == [
            Path(first.disk_path).name,
            Path(second.disk_path).name,
        ]


def test_serve_command_serves_http_probes_and_restores_versions_from_its_volume(tmp_path):
    store = tmp_path / "store"

    async def publish(address: str) -> None:
        async with ParamSyncClient(address) as ps:
            await ps.publish(1, weights(1))
            await ps.report_version("rollout-0", 1, ok=True, sync_s=0.25)

    async def latest(address: str) -> int:
        async with ParamSyncClient(address) as ps:
            fetched = await ps.fetch_version(0)
        assert torch.equal(fetched.tensors["w"], weights(1)["w"])
        return fetched.manifest.version

    with serve_process(tmp_path, RELAYRL_PARAMSYNC_STORE_DIR=str(store)) as (address, http_port, _):
        asyncio.run(publish(address))
        base = f"http://127.0.0.1:{http_port}"
        assert http_client.get(f"{base}/healthz").json()["status"] == "ok"
        assert http_client.get(f"{base}/readyz").status_code == 200
        metrics = http_client.get(f"{base}/metrics").text
        assert "relayrl_paramsync_versions_published_total 1.0" in metrics
        assert "relayrl_paramsync_sync_duration_seconds_count 1.0" in metrics
        listed = subprocess.run(
            [sys.executable, "-m", "commands.cli", "paramsync", "replicas", "--address", address],
            env=python_env(),
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )
        table = json.loads(listed.stdout)
        assert table["latest_version"] == 1 and table["replicas"][0]["replica_id"] == "rollout-0"
        # The write to the volume happens right after the upload is committed.
        deadline = time.monotonic() + 10
        while not list(store.glob("v*/model.safetensors")) and time.monotonic() < deadline:
            time.sleep(0.05)

    with serve_process(tmp_path, RELAYRL_PARAMSYNC_STORE_DIR=str(store)) as (address, _, _):
        assert asyncio.run(latest(address)) == 1


def test_serve_command_refuses_bad_settings_naming_the_variable():
    result = subprocess.run(
        [sys.executable, "-m", "commands.cli", "paramsync", "serve"],
        env=python_env(RELAYRL_PARAMSYNC_KEEP_VERSIONS="0"),
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2 and b"RELAYRL_PARAMSYNC_KEEP_VERSIONS" in result.stderr
