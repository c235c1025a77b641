"""Streamed uploads (``publish_streamed``) against a real paramsync: a link that breaks midway is
resumed from the bucket the trainer still holds; an upload abandoned by a killed or giving-up
trainer never becomes visible; a paramsync that stops answering fails the upload within its
deadline, naming the stage, the peer and the version."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import load_file

from commands.stack.chaos.proxy import FaultyProxy
from relayrl import http_client
from relayrl.net import free_port
from services.paramsync.client import ParamSyncClient
from services.paramsync.core import ParamSyncCore
from services.paramsync.errors import ParamSyncError, VersionUnavailable
from services.paramsync.tensors import as_pairs, open_specs
from tests.integration.paramsync.harness import REPO, python_env, running_service, serve_process, stop
from tests.integration.paramsync.test_processes import start_replica, table_of
from tests.waiting import wait_until_async

HERE = Path(__file__).parent
MiB = 1024 * 1024
RECEIVED = "relayrl_paramsync_bytes_received_bytes_total"


def version_tensors(seed: int) -> dict[str, torch.Tensor]:
    """One bucket each: a small tensor, one larger than every socket buffer on the way (so a cut
    lands inside it), and a bucket of odd dtypes."""
    g = torch.Generator().manual_seed(seed)
    return {
        "embed": torch.randn(MiB // 4, generator=g),
        "big": torch.randn(32 * MiB // 4, generator=g),
        "norm": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "steps": torch.randint(-(2**40), 2**40, (7,), generator=g),
    }


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def assert_bit_equal(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), name


async def metric(http_port: int, name: str, **labels: str) -> float:
    """A sample of paramsync's /metrics (0 when absent)."""
    async with http_client.async_client() as http:
        text = (await http.get(f"http://127.0.0.1:{http_port}/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def in_process_metric(service: ParamSyncCore, name: str, **labels: str) -> float:
    return service.metrics.service.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("split", [False, True], ids=["whole", "row_ranges"])
@pytest.mark.parametrize("link", ["dataplane", "grpc"])
async def test_an_upload_whose_link_breaks_midway_resumes_from_the_bucket_in_hand(tmp_path, link, split):
    """With ``split`` the big tensor comes as two buckets of rows (as a tensor larger than the
    trainer's bucket does), and the cut lands in the second: the upload resumes inside the tensor."""
    data_port = free_port()
    env = {"RELAYRL_PARAMSYNC_DATA_PORT": str(data_port), "RELAYRL_PARAMSYNC_UPLOAD_RESUME_WINDOW_S": "60"}
    with serve_process(tmp_path, **env) as (address, http_port, _):
        grpc_port = int(address.rpartition(":")[2])
        # The trainer reaches paramsync through proxies on 127.0.0.2 listening on paramsync's own
        # ports, so the data-plane port paramsync announces leads through a proxy as well.
        proxies = {"grpc": FaultyProxy("grpc", "127.0.0.1", grpc_port)}
        proxies["dataplane"] = FaultyProxy("dataplane", "127.0.0.1", data_port)
        for proxy in proxies.values():
            await proxy.start("127.0.0.2", proxy.target[1])
        flaky = proxies[link]
        tensors = version_tensors(seed=1)
        half = tensors["big"].numel() // 2
        big_buckets = [[tensors["big"][:half]], [tensors["big"][half:]]] if split else [[tensors["big"]]]
        before_big = nbytes(tensors["embed"])
        resume_at = before_big + (nbytes(big_buckets[0][0]) if split else 0)
        received_at_cut: list[float] = []

        async def cut_inside_big() -> float:
            async def past_embed() -> float:
                received = await metric(http_port, RECEIVED)
                return received if received > resume_at else 0.0

            received = await wait_until_async(past_embed, what="paramsync inside the big tensor", poll_s=0.01)
            flaky.latency_s = 0.0
            flaky.reset()  # RST both ways, as a flapping link does; bytes in flight are lost
            return received

        async def buckets() -> AsyncIterator[list[torch.Tensor]]:
            yield [tensors["embed"]]
            flaky.latency_s = 0.005  # slow the link so the cut lands while the big tensor is on its way
            cutting = asyncio.create_task(cut_inside_big())
            for bucket in big_buckets:
                yield bucket
            received_at_cut.append(await cutting)
            yield [tensors["norm"], tensors["steps"]]

        trainer = ParamSyncClient(
            f"127.0.0.2:{grpc_port}",
            sync_timeout=30,
            max_sync_retries=3,
            sync_retry_delay=0.2,
            data_plane=link == "dataplane",
        )
        try:
            result = await trainer.publish_streamed(1, open_specs(as_pairs(tensors)), buckets(), trainer_step=1)
        finally:
            await trainer.close()
            for proxy in proxies.values():
                await proxy.close()

        total = sum(nbytes(t) for t in tensors.values())
        assert result.bytes_received == result.total_bytes == total
        assert resume_at < received_at_cut[0] < total  # the link really broke midway
        async with ParamSyncClient(address) as replica:
            fetched = await replica.fetch_version(1)
        assert_bit_equal(fetched.tensors, tensors)
        assert await metric(http_port, "relayrl_paramsync_versions_published_total") == 1
        log = (tmp_path / f"paramsync-{grpc_port}.log").read_text()
        assert f"upload of version 1 resumed at byte {resume_at}" in log


def small_version(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4096,), value), "w2": torch.full((4096,), -value)}


async def test_an_uploader_killed_mid_upload_never_makes_its_version_visible(tmp_path):
    window_s = 2.0
    async with (
        running_service(upload_resume_window_s=window_s) as (address, service),
        ParamSyncClient(address, sync_retry_delay=0.1) as ps,
    ):
        await ps.publish(1, small_version(1.0))
        replica = start_replica(address, "rollout-0", tmp_path / "r0")
        try:

            async def replica_row():
                return (await table_of(ps)).get("rollout-0")

            async def in_sync_at_1() -> bool:
                row = await replica_row()
                return row is not None and row.version == 1 and row.state == "in_sync"

            await wait_until_async(in_sync_at_1, what="rollout-0 at version 1")
            uploader = subprocess.Popen(
                [sys.executable, str(HERE / "stalled_trainer.py"), address, "2", "streamed"],
                env=python_env(),
                cwd=REPO,
                stdout=subprocess.PIPE,
            )
            try:
                assert await asyncio.to_thread(uploader.stdout.readline) == b"HALF\n"
                first_bucket = 4096 * 4
                await wait_until_async(
                    lambda: in_process_metric(service, RECEIVED) >= 3 * first_bucket,  # version 1 and the bucket
                    what="the first bucket of version 2 at paramsync",
                )
                uploader.kill()  # SIGKILL: no goodbye, no abort
                uploader.wait(10)
                killed_at = time.monotonic()
            finally:
                stop(uploader)
                uploader.stdout.close()

            assert (await ps.list_replicas()).latest_version == 1
            # A fetch waits through the resume window, then fails cleanly.
            with pytest.raises(VersionUnavailable, match="version 2 is not held; held: \\[1\\]"):
                await ps.fetch(2)
            # Dropped when the window (a setting, default 10 s) ends, not before.
            assert window_s * 0.75 <= time.monotonic() - killed_at < window_s + 6
            assert in_process_metric(service, "relayrl_paramsync_publish_failures_total", reason="disconnected") == 1
            assert (await ps.list_replicas()).latest_version == 1
            fetched = await ps.fetch_version(0)
            assert fetched.manifest.version == 1 and torch.equal(fetched.tensors["w"], small_version(1.0)["w"])

            # The subscribed replica was told of version 2, failed to load it and kept version 1.
            async def failed_on_2():
                row = await replica_row()
                return row if row.consecutive_failures and "version 2" in row.last_error else None

            row = await wait_until_async(failed_on_2, what="rollout-0 to report that version 2 failed")
            assert row.version == 1
            assert (tmp_path / "r0" / "fetched.log").read_text().split() == ["1"]
            held = load_file(str(tmp_path / "r0" / "weights.safetensors"))
            assert_bit_equal(held, small_version(1.0))

            # The version number is free again: a new upload of version 2 goes through.
            assert (await ps.publish(2, small_version(2.5))).bytes_received == 2 * first_bucket
            assert_bit_equal(await ps.fetch(2), small_version(2.5))
            assert (await ps.list_replicas()).latest_version == 2
        finally:
            stop(replica)


@pytest.mark.parametrize("link", ["dataplane", "grpc"])
async def test_an_aborted_upload_is_dropped_at_once_and_never_becomes_visible(link):
    async with (
        running_service(upload_resume_window_s=120.0) as (address, service),
        ParamSyncClient(address, data_plane=link == "dataplane") as trainer,
        ParamSyncClient(address, sync_retry_delay=0.1) as replica,
    ):
        await trainer.publish(1, small_version(1.0))
        announcements = replica.subscribe("watcher", held_version=1)
        first = small_version(2.0)
        fetches: list[asyncio.Task[dict[str, torch.Tensor]]] = []

        async def buckets() -> AsyncIterator[list[torch.Tensor]]:
            yield [first["w"]]
            assert (await asyncio.wait_for(anext(announcements), 10)).version == 2
            fetches.append(asyncio.create_task(replica.fetch(2)))  # follows the upload as it arrives
            await wait_until_async(
                lambda: service.store.uploading.readers > 0, what="the fetch of version 2 following the upload"
            )
            raise RuntimeError("rank 1 died during the gather")

        with pytest.raises(RuntimeError, match="rank 1 died"):
            await trainer.publish_streamed(2, open_specs(as_pairs(first)), buckets())
        # Dropped at once, not after the (long) resume window: the fetch following it fails now.
        with pytest.raises(VersionUnavailable, match="version 2 is not held; held: \\[1\\]"):
            await asyncio.wait_for(fetches[0], 20)
        assert in_process_metric(service, "relayrl_paramsync_publish_failures_total", reason="aborted") == 1
        assert (await replica.list_replicas()).latest_version == 1
        assert_bit_equal(await replica.fetch(0), small_version(1.0))

        second = small_version(3.0)
        assert (await trainer.publish(2, second)).bytes_received == 2 * 4096 * 4
        assert_bit_equal(await replica.fetch(2), second)


@pytest.mark.parametrize("link", ["dataplane", "grpc"])
async def test_an_upload_to_a_stopped_paramsync_fails_in_time_naming_stage_peer_and_version(tmp_path, link):
    data_port = free_port()
    env = {"RELAYRL_PARAMSYNC_DATA_PORT": str(data_port), "RELAYRL_PARAMSYNC_UPLOAD_RESUME_WINDOW_S": "1"}
    sync_timeout = 3.0
    with serve_process(tmp_path, **env) as (address, http_port, proc):
        old = version_tensors(seed=1)
        new = version_tensors(seed=2)
        async with ParamSyncClient(address) as setup:
            await setup.publish(1, old)
        async with ParamSyncClient(
            address, sync_timeout=sync_timeout, max_sync_retries=0, data_plane=link == "dataplane"
        ) as trainer:

            async def buckets() -> AsyncIterator[list[torch.Tensor]]:
                yield [new["embed"]]
                received = sum(nbytes(t) for t in old.values()) + nbytes(new["embed"])
                await wait_until_async(
                    lambda: _at_least(metric(http_port, RECEIVED), received), what="the first bucket at paramsync"
                )
                proc.send_signal(signal.SIGSTOP)  # paramsync hangs: its sockets stay open, nothing moves
                yield [new["big"]]  # larger than the socket buffers: the send blocks
                yield [new["norm"], new["steps"]]

            started = time.monotonic()
            try:
                with pytest.raises(ParamSyncError) as failure:
                    await trainer.publish_streamed(2, open_specs(as_pairs(new)), buckets())
                failed_after = time.monotonic() - started
            finally:
                proc.send_signal(signal.SIGCONT)
        assert failure.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        message = str(failure.value)
        peer = f"127.0.0.1:{data_port}" if link == "dataplane" else address
        assert "upload of version 2" in message and peer in message, message
        # The deadline, plus at most as long again for the abort paramsync cannot answer.
        assert failed_after < 3 * sync_timeout
        async with ParamSyncClient(address, sync_retry_delay=0.1) as replica:
            assert (await replica.list_replicas()).latest_version == 1
            fetched = await replica.fetch_version(0)
            assert fetched.manifest.version == 1
            assert_bit_equal(fetched.tensors, old)

            async def dropped() -> bool:
                try:
                    await replica.fetch(2)
                except VersionUnavailable:
                    return True
                return False

            await wait_until_async(dropped, what="the stalled upload of version 2 to be dropped")
            assert (await replica.list_replicas()).latest_version == 1
        assert proc.poll() is None  # paramsync itself lives on


async def _at_least(value, floor: float) -> bool:
    return await value >= floor
