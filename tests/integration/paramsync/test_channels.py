"""Each byte channel's two ends through the one ByteChannel interface, against a real paramsync
(gRPC server and TCP data plane): what one peer sends, another receives byte for byte, and a
receiver whose bytes differ from the checksums gets nothing. ``torch_dist``'s two ends run in two
processes joined by a real gloo group."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from relayrl.net import free_port, wait_for_port
from relayrl.serving import grpc_channel
from services.paramsync.channels.base import ByteChannel, TensorRun
from services.paramsync.channels.dataplane import DataPlaneAddress
from services.paramsync.channels.disk import DiskChannel
from services.paramsync.channels.grpc_chunks import GrpcChunksChannel, stream_calls
from services.paramsync.channels.tcp import TcpChannel
from services.paramsync.channels.torch_dist import EngineGroupLink, TorchDistSender
from services.paramsync.digest import new_hasher
from services.paramsync.manifest import Manifest
from services.paramsync.store import StoredVersion
from services.paramsync.tensors import as_pairs, open_specs
from tests.integration.paramsync.harness import REPO, python_env, running_service
from tests.integration.paramsync.harness import stop as stop_process

WEIGHTS = {
    "a": torch.arange(300_000, dtype=torch.float32),
    "b": torch.ones(7, 5, dtype=torch.bfloat16),
    "e": torch.empty(0),
}


def _runs(manifest: Manifest, tensors: dict[str, torch.Tensor]) -> AsyncIterator[TensorRun]:
    """Two runs, the first ending inside tensor "a" (a tensor larger than a bucket), each tensor's
    checksum computed from its bytes and sent with the run that holds its last byte."""

    def raw(tensor: torch.Tensor) -> memoryview:
        return memoryview(tensor.contiguous().view(torch.uint8).numpy()).cast("B")

    async def runs() -> AsyncIterator[TensorRun]:
        names = [spec.name for spec in manifest.tensors]
        sums = []
        for name in names:
            hasher = new_hasher(manifest.checksum_algorithm)
            hasher.update(raw(tensors[name]))
            sums.append(hasher.hexdigest())
        split = 100_000 * 4
        a = raw(tensors["a"])
        yield TensorRun(0, [], [a[:split]], 0, split)
        yield TensorRun(0, sums, [a[split:], *(raw(tensors[n]) for n in names[1:])], split, manifest.total_bytes)

    return runs()


async def _send_and_receive(sender: ByteChannel, receiver: ByteChannel, version: int) -> dict[str, bytes]:
    manifest = Manifest(version, tuple(open_specs(as_pairs(WEIGHTS))))
    assert await sender.send(manifest, _runs(manifest, WEIGHTS)) == manifest.total_bytes
    return await _receive(receiver, version)


async def _receive(receiver: ByteChannel | DiskChannel, version: int) -> dict[str, bytes]:
    """``version`` received into fresh buffers given by ``place``, as each tensor's bytes."""
    buffers: dict[str, bytearray] = {}

    def place(got: Manifest) -> list[memoryview]:
        for spec in got.tensors:
            buffers[spec.name] = bytearray(spec.num_bytes)
        return [memoryview(buffers[spec.name]) for spec in got.tensors]

    received = await receiver.receive(version, place)
    assert received.version == version and not received.is_open
    return {name: bytes(buf) for name, buf in buffers.items()}


def _expected() -> dict[str, bytes]:
    return {n: t.contiguous().view(torch.uint8).numpy().tobytes() for n, t in WEIGHTS.items()}


async def test_tcp_channel_both_ends() -> None:
    async with running_service() as (_, service):
        address = DataPlaneAddress("127.0.0.1", service.data_port)
        assert service.data_port
        got = await _send_and_receive(TcpChannel(address, 10.0), TcpChannel(address, 10.0, "r0"), 1)
    assert got == _expected()


async def test_grpc_chunks_channel_both_ends() -> None:
    async with running_service() as (grpc_address, _):
        channel = grpc_channel(grpc_address)
        publish, fetch = stream_calls(channel)
        try:
            # Small chunks: every tensor but the empty one crosses as several chunk messages.
            ends = [GrpcChunksChannel(publish, fetch, "paramsync", 4096, 10.0, rid) for rid in ("", "r0")]
            got = await _send_and_receive(ends[0], ends[1], 1)
        finally:
            await channel.close()
    assert got == _expected()


def _stored(version: int) -> StoredVersion:
    """WEIGHTS as a complete version, as paramsync holds one."""
    opened = Manifest(version, tuple(open_specs(as_pairs(WEIGHTS))))
    sums = []
    for data in _expected().values():
        hasher = new_hasher(opened.checksum_algorithm)
        hasher.update(data)
        sums.append(hasher.hexdigest())
    stored = StoredVersion.empty(opened.with_checksums(sums))
    stored.data[:] = b"".join(_expected().values())
    return stored


async def test_disk_channel_both_ends(tmp_path: Path) -> None:
    disk = DiskChannel(tmp_path, keep_versions=1)
    directory = await disk.send(_stored(3))
    assert directory.is_dir()
    assert await _receive(disk, 3) == _expected()
    # a flipped byte on disk: the receiving end refuses the version
    path = directory / "model.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        await _receive(disk, 3)


async def test_torch_dist_channel_both_ends(tmp_path: Path) -> None:
    port = free_port()
    receiver = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "torch_dist_receiver_proc.py"), str(port), str(tmp_path)],
        env=python_env(),
        cwd=REPO,
    )
    link = EngineGroupLink(f"http://127.0.0.1:{port}", 60.0)
    try:
        wait_for_port("127.0.0.1", port, 60.0)
        # Buckets smaller than "a": the broadcast crosses in several rounds of HTTP call + broadcasts.
        sender = TorchDistSender("127.0.0.1", 0, "gloo", bucket_bytes=64 * 1024, timeout_s=60.0)
        await sender.send(_stored(5), [link])
    finally:
        await link.aclose()
        stop_process(receiver)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == _expected()
