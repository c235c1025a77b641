"""The bulk data plane over real TCP sockets: the same rules as the gRPC streams, and its own bad input."""

from __future__ import annotations

import asyncio
import logging
import socket

import grpc
import pytest
import torch

from relayrl.net import free_port
from relayrl.v1 import paramsync_pb2 as pb
from services.paramsync.channels import tcp
from services.paramsync.channels.dataplane import (
    LENGTH,
    MAX_FRAME_BYTES,
    DataPlaneAddress,
    frame,
    recv_exactly,
    recv_frame,
)
from services.paramsync.client import ParamSyncClient
from services.paramsync.errors import ChecksumMismatch, VersionUnavailable
from services.paramsync.manifest import Manifest
from services.paramsync.tensors import as_pairs, build_manifest, open_specs, raw_bytes
from tests.integration.paramsync.harness import running_service, send_one_run
from tests.integration.paramsync.test_publish_fetch import same, weights
from tests.waiting import wait_until_async


def data_plane_of(service) -> DataPlaneAddress:
    assert service.data_port > 0
    return DataPlaneAddress("127.0.0.1", service.data_port)


def ps_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def start_upload(address: DataPlaneAddress, manifest: Manifest, first_bytes: bytes) -> socket.socket:
    """An upload that sent ``first_bytes`` and holds the rest back (blocking: call it from a thread,
    since paramsync serves on the test's loop)."""
    sock = socket.create_connection((address.host, address.port), timeout=10)
    sock.sendall(frame(pb.BulkRequest(publish=manifest.to_proto())))
    assert recv_frame(sock, pb.BulkReply).code == 0
    sock.sendall(first_bytes)
    return sock


def exchange(address: DataPlaneAddress, payload: bytes) -> pb.BulkReply:
    with socket.create_connection((address.host, address.port), timeout=10) as sock:
        sock.sendall(payload)
        return recv_frame(sock, pb.BulkReply)


async def test_the_client_uses_the_data_plane_and_gets_exact_tensors():
    async with running_service() as (address, service), ParamSyncClient(address) as ps:
        await ps.publish(1, weights(1))
        assert same(await ps.fetch(1), weights(1))
        sent = f'relayrl_paramsync_bytes_sent_bytes_total{{transport="dataplane"}} {float(ps_bytes(weights(1)))}'

        async def counted() -> str:
            metrics = service.metrics.service.render()[0].decode()
            return metrics if sent in metrics else ""

        assert 'transport="grpc"' not in await wait_until_async(counted, 5, "bytes_sent to count the fetch")


async def test_corrupt_bytes_are_refused_and_the_previous_version_stays_served():
    async with running_service() as (address, service), ParamSyncClient(address) as ps:
        await ps.publish(1, weights(1))
        pairs = as_pairs(weights(2))
        manifest = build_manifest(2, pairs, 0, "xxh3_128")
        views = [memoryview(bytearray(raw_bytes(t))) for _, t in pairs]
        views[0][100] ^= 0x01  # embed.weight
        with pytest.raises(ChecksumMismatch, match=r"embed\.weight"):
            await tcp.publish(data_plane_of(service), manifest, views, timeout_s=10)

        assert same(await ps.fetch(), weights(1))
        with pytest.raises(VersionUnavailable):
            await ps.fetch(2)
        metrics = service.metrics.service.render()[0].decode()
        assert 'relayrl_paramsync_publish_failures_total{reason="checksum"} 1.0' in metrics
        await ps.publish(2, weights(2))
        assert same(await ps.fetch(2), weights(2))


def version_one() -> tuple[list, Manifest, bytes]:
    """Version 1's tensors, its manifest and its bytes as one upload body, for a raw data-plane upload."""
    pairs = as_pairs(weights(1))
    return pairs, build_manifest(1, pairs, 0, "xxh3_128"), b"".join(bytes(raw_bytes(t)) for _, t in pairs)


async def test_a_fetch_receives_bytes_while_the_upload_is_still_arriving():
    async with running_service() as (address, service), ParamSyncClient(address) as ps:
        plane = data_plane_of(service)
        pairs, manifest, _ = version_one()
        first = bytes(raw_bytes(pairs[0][1]))
        rest = b"".join(bytes(raw_bytes(t)) for _, t in pairs[1:])

        uploader = await asyncio.to_thread(start_upload, plane, manifest, first)
        with uploader:

            def fetch_first_tensor() -> bytes:
                with socket.create_connection((plane.host, plane.port), timeout=10) as sock:
                    sock.sendall(frame(pb.BulkRequest(fetch=pb.FetchRequest(replica_id="r0", version=1))))
                    reply = recv_frame(sock, pb.BulkReply)
                    assert reply.manifest.version == 1
                    got = bytearray(len(first))
                    recv_exactly(sock, memoryview(got))
                    return bytes(got)

            assert await asyncio.to_thread(fetch_first_tensor) == first
            assert service.store.latest is None  # the trainer has not finished

            fetching = asyncio.ensure_future(ps.fetch(1))
            await asyncio.sleep(0.1)
            assert not fetching.done()
            await asyncio.to_thread(uploader.sendall, rest)
            final = await asyncio.to_thread(recv_frame, uploader, pb.BulkReply)
        assert final.code == 0 and final.bytes_received == ps_bytes(weights(1))
        assert same(await asyncio.wait_for(fetching, 10), weights(1))


async def test_an_evicted_version_being_fetched_is_not_overwritten_by_newer_uploads():
    big = {"w": torch.arange(4 * 1024 * 1024, dtype=torch.float32)}  # 16 MiB: more than socket buffers hold
    async with running_service(keep_versions=1) as (address, service), ParamSyncClient(address) as ps:
        plane = data_plane_of(service)
        await ps.publish(1, big)
        slow = socket.create_connection((plane.host, plane.port), timeout=10)
        with slow:
            slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            slow.sendall(frame(pb.BulkRequest(fetch=pb.FetchRequest(replica_id="slow", version=1))))
            assert (await asyncio.to_thread(recv_frame, slow, pb.BulkReply)).manifest.version == 1
            # Version 1 is evicted by version 2; version 3 would reuse its memory if nobody read it.
            await ps.publish(2, {"w": big["w"] + 1})
            await ps.publish(3, {"w": big["w"] + 2})
            got = bytearray(ps_bytes(big))
            await asyncio.to_thread(recv_exactly, slow, memoryview(got))
        assert torch.equal(torch.frombuffer(got, dtype=torch.float32), big["w"])
        assert torch.equal((await ps.fetch(3))["w"], big["w"] + 2)


async def test_bad_requests_get_a_status_and_the_data_plane_keeps_serving():
    async with running_service() as (address, service), ParamSyncClient(address) as ps:
        plane = data_plane_of(service)
        no_checksums = pb.WeightManifest(
            version=1, total_bytes=4, tensors=[pb.TensorSpec(name="w", dtype="uint8", shape=[4], num_bytes=4)]
        )
        cases = [
            (LENGTH.pack(5) + b"\xff\xff\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "does not decode"),
            (LENGTH.pack(MAX_FRAME_BYTES + 1), grpc.StatusCode.INVALID_ARGUMENT, "exceeds"),
            (frame(pb.BulkRequest()), grpc.StatusCode.INVALID_ARGUMENT, "no operation"),
            (frame(pb.BulkRequest(publish=no_checksums)), grpc.StatusCode.INVALID_ARGUMENT, "invalid manifest"),
            (frame(pb.BulkRequest(fetch=pb.FetchRequest(version=-1))), grpc.StatusCode.INVALID_ARGUMENT, ">= 0"),
            (frame(pb.BulkRequest(fetch=pb.FetchRequest(version=7))), grpc.StatusCode.NOT_FOUND, "not held"),
        ]
        for payload, code, text in cases:
            reply = await asyncio.to_thread(exchange, plane, payload)
            assert reply.code == code.value[0] and text in reply.message, (code, reply)

        await ps.publish(1, weights(1))
        stale = frame(pb.BulkRequest(publish=build_manifest(1, as_pairs(weights(2)), 0, "xxh3_128").to_proto()))
        reply = await asyncio.to_thread(exchange, plane, stale)
        assert reply.code == grpc.StatusCode.FAILED_PRECONDITION.value[0] and "content differs" in reply.message
        assert same(await ps.fetch(1), weights(1))


@pytest.mark.parametrize(
    ("first_tensor", "end_byte", "text"),
    [(1, 4, "does not lie in tensor 1"), (0, 10**12, "do not lie"), (0, 0, "do not lie"), (9, 4, "of")],
    ids=["starts_in_another_tensor", "ends_past_the_version", "no_end_and_no_checksum", "unknown_tensor"],
)
async def test_a_run_outside_its_place_in_the_upload_is_refused(first_tensor, end_byte, text):
    """A streamed upload's run must begin inside its first tensor, where the bytes so far end, and
    end inside the version: anything else gets INVALID_ARGUMENT, and the previous version stays."""
    async with running_service() as (address, service), ParamSyncClient(address) as ps:
        await ps.publish(1, weights(1))
        opened = Manifest(2, tuple(open_specs(as_pairs(weights(2)))))
        run = pb.TensorChecksums(first_tensor=first_tensor, end_byte=end_byte)
        reply = await asyncio.to_thread(send_one_run, service.data_port, opened, run)
        assert reply.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and text in reply.message, reply
        assert same(await ps.fetch(0), weights(1))


async def test_without_a_reachable_data_plane_the_client_falls_back_to_grpc(caplog):
    async with running_service() as (address, service), ParamSyncClient(address) as ps:
        service.data_port = free_port()  # advertised, but nothing listens there
        with caplog.at_level(logging.WARNING, logger="services.paramsync.client"):
            await ps.publish(1, weights(1))
            assert same(await ps.fetch(1), weights(1))
        assert "using gRPC streams" in caplog.text
        metrics = service.metrics.service.render()[0].decode()
        assert 'relayrl_paramsync_bytes_sent_bytes_total{transport="grpc"}' in metrics


async def test_a_paramsync_without_data_plane_is_reached_over_grpc():
    async with running_service(data_plane=False) as (address, service), ParamSyncClient(address) as ps:
        assert service.data_port == 0
        await ps.publish(1, weights(1))
        assert same(await ps.fetch(1), weights(1))


async def test_cancelling_a_fetch_stops_it_at_once_and_paramsync_serves_on():
    async with running_service() as (address, service), ParamSyncClient(address) as ps:
        plane = data_plane_of(service)
        _, manifest, payload = version_one()

        # The rest is held back: the fetch below waits for it.
        uploader = await asyncio.to_thread(start_upload, plane, manifest, payload[:100])
        with uploader:
            fetching = asyncio.ensure_future(ps.fetch(1))
            await asyncio.sleep(0.3)
            fetching.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(fetching, 2)

            await asyncio.to_thread(uploader.sendall, payload[100:])
            assert (await asyncio.to_thread(recv_frame, uploader, pb.BulkReply)).code == 0
        assert same(await ps.fetch(1), weights(1))


async def test_tensors_a_replica_holds_are_never_overwritten_by_later_fetches():
    async with running_service(keep_versions=3) as (address, _), ParamSyncClient(address) as ps:
        for version in (1, 2, 3):
            await ps.publish(version, weights(version))
        held_one = await ps.fetch(1)
        held_two = await ps.fetch(2)  # version 1's memory is still in use: fresh memory
        assert same(held_one, weights(1))
        del held_one  # its memory may now be reused
        held_three = await ps.fetch(3)
        assert same(held_two, weights(2)) and same(held_three, weights(3))


@pytest.mark.parametrize("forward_streams", [1, 0])
async def test_only_forward_streams_fetches_are_fed_while_the_upload_runs(forward_streams):
    async with running_service(forward_streams=forward_streams) as (_, service):
        plane = data_plane_of(service)
        _, manifest, payload = version_one()
        half = len(payload) // 2

        def start_fetch() -> socket.socket:
            sock = socket.create_connection((plane.host, plane.port), timeout=10)
            sock.sendall(frame(pb.BulkRequest(fetch=pb.FetchRequest(version=1))))
            assert recv_frame(sock, pb.BulkReply).manifest.version == 1
            return sock

        def bytes_waiting(sock: socket.socket) -> int:
            sock.settimeout(0.5)
            try:
                return len(sock.recv(len(payload), socket.MSG_PEEK))
            except TimeoutError:
                return 0

        uploader = await asyncio.to_thread(start_upload, plane, manifest, payload[:half])
        first, second = [await asyncio.to_thread(start_fetch) for _ in range(2)]
        with uploader, first, second:
            assert await asyncio.to_thread(bytes_waiting, first) == half
            assert await asyncio.to_thread(bytes_waiting, second) == (half if forward_streams == 0 else 0)
            await asyncio.to_thread(uploader.sendall, payload[half:])
            assert (await asyncio.to_thread(recv_frame, uploader, pb.BulkReply)).code == 0
            for sock in (first, second):
                got = bytearray(len(payload))
                sock.settimeout(10)
                await asyncio.to_thread(recv_exactly, sock, memoryview(got))
                assert got == payload
