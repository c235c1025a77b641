"""Weights that cross no socket on paramsync's host, against a real paramsync: a replica maps each
version's memory file instead of receiving its bytes (the ``shared_memory`` channel), the file is
a safetensors file whose tensors equal the published ones bit for bit, paramsync never writes
another version into memory a replica mapped until that replica reports a newer version, and an
upload whose tensors lie in a memory file of the trainer is copied from it by paramsync. A
replica or trainer on another host moves the bytes over the data plane instead."""

from __future__ import annotations

import asyncio
import mmap
import os
import socket
from pathlib import Path

import grpc
import pytest
import torch

from relayrl import http_client
from relayrl.v1 import paramsync_pb2 as pb
from services.engine.weights import read_safetensors_dir
from services.paramsync import memory_files
from services.paramsync.channels import shared_memory as shm
from services.paramsync.channels.dataplane import DataPlaneAddress
from services.paramsync.client import ParamSyncClient
from services.paramsync.errors import VersionUnavailable
from services.paramsync.manifest import Manifest
from services.paramsync.memfile import VersionFiles
from services.paramsync.tensors import as_pairs, open_specs
from tests.integration.paramsync.harness import running_service, send_one_run, serve_process

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir() or not hasattr(os, "memfd_create"), reason="no memory files here")


def weights(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(3000, generator=generator),
        "b": torch.randn(7, 5, generator=generator).to(torch.bfloat16),
        "c": torch.randint(0, 100, (11,), generator=generator),
    }


def assert_bit_equal(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert got[name].view(torch.uint8).equal(tensor.contiguous().view(torch.uint8)), name


def data_bytes(mapped: shm.MappedVersion) -> bytes:
    """The tensors' bytes as the mapped file holds them now."""
    size = os.fstat(mapped.fd).st_size
    return os.pread(mapped.fd, mapped.manifest.total_bytes, size - mapped.manifest.total_bytes)


async def test_a_replica_on_paramsyncs_host_maps_each_version_and_keeps_only_the_newest(tmp_path: Path) -> None:
    files = VersionFiles(SHM / f"relayrl-test-{tmp_path.name}")
    try:
        with serve_process(tmp_path) as (address, _, _):
            async with ParamSyncClient(address) as client:
                for version in (1, 2):
                    await client.publish(version, weights(version))
                    directory = await client.fetch_to_file(version, files, "r0")
                    link = directory / "model.safetensors"
                    assert link.is_symlink() and os.readlink(link).startswith(f"/proc/{os.getpid()}/fd/")
                    assert_bit_equal(read_safetensors_dir(directory), weights(version))
                    files.prune()
                assert client.shared_memory, "still mapping"
        # Outlives paramsync: the replica holds its own descriptor of the memory.
        assert_bit_equal(read_safetensors_dir(directory), weights(2))
        assert files.versions() == [2], "a mapped version older than the newest is let go"
    finally:
        files.close()
    assert not files.root.exists()


async def test_a_replica_on_another_host_receives_the_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = VersionFiles(SHM / f"relayrl-test-{tmp_path.name}")
    try:
        with serve_process(tmp_path) as (address, _, _):
            # This process now claims another host name than paramsync's.
            monkeypatch.setattr(socket, "gethostname", lambda: "elsewhere")
            async with ParamSyncClient(address) as client:
                await client.publish(1, weights(1))
                directory = await client.fetch_to_file(1, files, "r0")
                assert not client.shared_memory, "no mapping tried again"
        link = directory / "model.safetensors"
        assert link.is_file() and not link.is_symlink()
        assert_bit_equal(read_safetensors_dir(directory), weights(1))
    finally:
        files.close()


async def test_mapped_memory_is_not_rewritten_until_the_replica_reports_a_newer_version() -> None:
    # One version kept: every commit evicts the previous one, whose memory the next upload reuses.
    async with running_service(keep_versions=1) as (address, service), ParamSyncClient(address) as client:
        data_plane = DataPlaneAddress("127.0.0.1", service.data_port)
        await client.publish(1, weights(1))
        mapped = await shm.map_version(data_plane, pb.FetchRequest(replica_id="r0", version=1), 10.0)
        try:
            first = data_bytes(mapped)
            for version in (2, 3, 4):
                await client.publish(version, weights(version))
                assert data_bytes(mapped) == first, f"version 1's memory changed under r0 at version {version}"
            await client.report_version("r0", 4)
            await client.publish(5, weights(5))
            assert data_bytes(mapped) != first, "released memory is reused by the next upload"
        finally:
            mapped.close()


async def test_a_map_request_names_its_replica_and_a_held_version() -> None:
    async with running_service() as (address, service), ParamSyncClient(address) as client:
        data_plane = DataPlaneAddress("127.0.0.1", service.data_port)
        await client.publish(1, weights(1))
        with pytest.raises(Exception, match="names its replica"):
            await shm.map_version(data_plane, pb.FetchRequest(version=1), 10.0)
        with pytest.raises(VersionUnavailable, match="not held"):
            await shm.map_version(data_plane, pb.FetchRequest(replica_id="r0", version=7), 10.0)
        assert not service.store.get(1).mapped_by


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 64) * 64


class MemoryFile:
    """Tensors living in a memory file this process registered, as the trainer's gather buffers are."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        size = sum(_aligned(t.numel() * t.element_size()) for t in tensors.values())
        self.fd = os.memfd_create("relayrl-test-upload", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED)
        whole = torch.frombuffer(self.map, dtype=torch.uint8)
        self.start = whole.data_ptr()
        memory_files.register(self.start, size, self.fd)
        self.tensors, position = {}, 0
        for name, tensor in tensors.items():
            nbytes = tensor.numel() * tensor.element_size()
            view = whole[position : position + nbytes].view(tensor.dtype).reshape(tensor.shape)
            view.copy_(tensor)
            self.tensors[name], position = view, position + _aligned(nbytes)

    def close(self) -> None:
        memory_files.unregister(self.start)
        self.tensors.clear()
        os.close(self.fd)


def copied_bytes(http_port: int) -> float:
    text = http_client.get(f"http://127.0.0.1:{http_port}/metrics").text
    (line,) = [line for line in text.splitlines() if line.startswith("relayrl_paramsync_bytes_copied_bytes_total ")]
    return float(line.split()[1])


@pytest.mark.parametrize("same_host", [True, False], ids=["same host", "another host"])
async def test_an_upload_from_a_memory_file_is_copied_by_paramsync_on_the_same_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, same_host: bool
) -> None:
    source = MemoryFile(weights(1))
    try:
        with serve_process(tmp_path) as (address, http_port, _):
            if not same_host:
                monkeypatch.setattr(socket, "gethostname", lambda: "elsewhere")
            async with ParamSyncClient(address) as client:
                published = await client.publish(1, source.tensors)
                assert client.shared_memory == same_host, "refused once: runs travel as bytes from then on"
                fetched = await client.fetch(1)
            copied = copied_bytes(http_port)
    finally:
        source.close()
    assert_bit_equal(fetched, weights(1))
    assert copied == (published.total_bytes if same_host else 0)


async def test_a_shared_run_whose_offsets_do_not_match_its_tensors_is_refused() -> None:
    async with running_service() as (address, service), ParamSyncClient(address) as client:
        await client.publish(1, weights(1))
        opened = Manifest(2, tuple(open_specs(as_pairs(weights(2)))))
        run = pb.TensorChecksums(
            first_tensor=0,
            checksums=["0" * 32],
            shared=pb.SharedBytes(host=socket.gethostname(), pid=os.getpid(), fd=0, offsets=[0, 64]),
        )
        reply = await asyncio.to_thread(send_one_run, service.data_port, opened, run)
        assert reply.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "offsets" in reply.message
        assert_bit_equal(await client.fetch(0), weights(1))
