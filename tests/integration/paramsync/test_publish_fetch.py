"""Publishing and fetching against a real gRPC server: checks, refusals, forwarding and bad input.

Tests that drive the Publish and Fetch RPCs directly cover the gRPC streams; the bulk data plane
has its own module (test_dataplane.py).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from relayrl.net import free_port
from relayrl.serving import grpc_channel
from relayrl.v1 import paramsync_pb2 as pb
from relayrl.v1 import paramsync_pb2_grpc as pb_grpc
from services.paramsync.client import ParamSyncClient
from services.paramsync.errors import ParamSyncError, VersionConflict, VersionUnavailable
from services.paramsync.tensors import as_pairs, build_manifest, raw_bytes
from tests.integration.paramsync.harness import running_service


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 16, generator=g),
        "norm.weight": torch.randn(16, generator=g).to(torch.bfloat16),
        "step": torch.tensor(seed),
        "empty": torch.zeros(0, 3),
    }


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def upload_messages(version: int, state: dict[str, torch.Tensor], chunk: int = 1000, corrupt: bool = False):
    pairs = as_pairs(state)
    manifest = build_manifest(version, pairs, 0, "sha256")
    messages = [pb.WeightStreamMessage(manifest=manifest.to_proto())]
    for name, tensor in pairs:
        data = bytearray(raw_bytes(tensor))
        if corrupt and name == "embed.weight":
            data[100] ^= 0x01
        for offset in range(0, len(data), chunk):
            piece = bytes(data[offset : offset + chunk])
            messages.append(pb.WeightStreamMessage(chunk=pb.WeightChunk(tensor_name=name, offset=offset, data=piece)))
    return messages


async def stream(messages):
    for m in messages:
        yield m


@pytest.mark.parametrize("data_plane", [False, True], ids=["grpc-streams", "data-plane"])
async def test_published_version_is_fetched_exactly_and_versions_only_move_forward(data_plane):
    async with (
        running_service(chunk_bytes=4096) as (address, _),
        ParamSyncClient(address, chunk_bytes=3000, data_plane=data_plane) as ps,
    ):
        v1 = weights(1)
        result = await ps.publish(1, v1, trainer_step=10)
        assert result.version == 1 and result.bytes_received == result.total_bytes > 0
        fetched = await ps.fetch_version(0)
        assert fetched.manifest.version == 1 and fetched.manifest.trainer_step == 10
        assert same(fetched.tensors, v1)

        # The trainer re-publishes its current version after a restart: a no-op success.
        again = await ps.publish(1, v1)
        assert again.version == 1 and again.bytes_received == 0

        with pytest.raises(VersionConflict, match="content differs"):
            await ps.publish(1, weights(2))
        await ps.publish(2, weights(2))
        with pytest.raises(VersionConflict, match="not newer than the latest version 2"):
            await ps.publish(1, v1)
        assert same(await ps.fetch(1), v1) and same(await ps.fetch(), weights(2))
        assert (await ps.list_replicas()).latest_version == 2


async def test_a_corrupted_chunk_is_rejected_and_the_previous_version_stays_served():
    async with running_service() as (address, service), ParamSyncClient(address) as ps:
        await ps.publish(1, weights(1))
        async with grpc_channel(address) as channel:
            stub = pb_grpc.ParamSyncStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Publish(stream(upload_messages(2, weights(2), corrupt=True)))
            assert err.value.code() == grpc.StatusCode.DATA_LOSS
            assert "embed.weight" in err.value.details()

            # Missing bytes: the stream ends early.
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Publish(stream(upload_messages(2, weights(2))[:-3]))
            assert err.value.code() == grpc.StatusCode.DATA_LOSS and "upload ended after" in err.value.details()

        assert same(await ps.fetch(), weights(1))
        with pytest.raises(VersionUnavailable):
            await ps.fetch(2)
        metrics = service.metrics.service.render()[0].decode()
        assert 'relayrl_paramsync_publish_failures_total{reason="checksum"} 1.0' in metrics
        assert 'relayrl_paramsync_publish_failures_total{reason="incomplete"} 1.0' in metrics
        # The trainer can still publish version 2 afterwards.
        await ps.publish(2, weights(2))
        assert same(await ps.fetch(2), weights(2))


async def test_replicas_receive_chunks_before_the_upload_finishes():
    async with running_service(chunk_bytes=4096) as (address, _), grpc_channel(address) as channel:
        stub = pb_grpc.ParamSyncStub(channel)
        messages = upload_messages(1, weights(1), chunk=1000)
        gate = asyncio.Event()

        first_tensor = [m for m in messages[1:] if m.chunk.tensor_name == "embed.weight"]

        async def trainer():
            for m in messages[: 1 + len(first_tensor)]:
                yield m
            await gate.wait()  # the trainer is slow: the rest comes only when the test allows it
            for m in messages[1 + len(first_tensor) :]:
                yield m

        publish = asyncio.ensure_future(stub.Publish(trainer()))
        replica = pb_grpc.ParamSyncStub(channel)
        subscription = replica.Subscribe(pb.SubscribeRequest(replica_id="r0"))
        announcement = await asyncio.wait_for(anext(aiter(subscription)), 5)
        assert announcement.version == 1 and announcement.transport == "grpc"

        fetch = replica.Fetch(pb.FetchRequest(replica_id="r0", version=1)).__aiter__()
        first = await asyncio.wait_for(anext(fetch), 5)
        second = await asyncio.wait_for(anext(fetch), 5)
        assert first.HasField("manifest") and second.chunk.tensor_name == "embed.weight"
        assert second.chunk.data == b"".join(m.chunk.data for m in first_tensor)
        assert not publish.done()

        gate.set()
        rest = [m async for m in fetch]
        assert sum(len(m.chunk.data) for m in rest) + len(second.chunk.data) == first.manifest.total_bytes
        assert (await publish).version == 1
        subscription.cancel()


async def test_a_fetch_that_sees_corrupt_bytes_raises_and_returns_nothing():
    async with running_service(chunk_bytes=4096) as (address, _), grpc_channel(address) as channel:
        stub = pb_grpc.ParamSyncStub(channel)
        gate = asyncio.Event()
        corrupt = upload_messages(1, weights(1), corrupt=True)

        async def trainer():
            for m in corrupt[:-1]:
                yield m
            await gate.wait()

        publish = asyncio.ensure_future(stub.Publish(trainer()))
        await asyncio.sleep(0.2)  # the corrupt bytes are in flight, the upload not yet ended
        async with ParamSyncClient(address, max_sync_retries=0) as ps:
            # Depending on timing the client receives the corrupt tensor (forwarded before
            # paramsync finished checking it) and refuses it, finds the version dropped, or, on
            # the data plane, sees the stream cut when paramsync drops it: never a version.
            with pytest.raises(ParamSyncError):
                await ps.fetch(1)
        gate.set()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await publish
        assert err.value.code() == grpc.StatusCode.DATA_LOSS


async def test_bad_requests_get_clear_grpc_statuses():
    async with running_service() as (address, _), grpc_channel(address) as channel:
        stub = pb_grpc.ParamSyncStub(channel)
        chunk_first = [pb.WeightStreamMessage(chunk=pb.WeightChunk(tensor_name="w", data=b"x"))]
        bad_manifest = [pb.WeightStreamMessage(manifest=pb.WeightManifest(version=1))]
        wrong_total = upload_messages(1, weights(1))
        wrong_total[0].manifest.total_bytes += 1
        cases = [
            (stub.Publish(stream([])), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
            (stub.Publish(stream(chunk_first)), grpc.StatusCode.INVALID_ARGUMENT, "must be a manifest"),
            (stub.Publish(stream(bad_manifest)), grpc.StatusCode.INVALID_ARGUMENT, "checksum_algorithm"),
            (stub.Publish(stream(wrong_total)), grpc.StatusCode.INVALID_ARGUMENT, "total_bytes"),
            (stub.ReportVersion(pb.ReportVersionRequest()), grpc.StatusCode.INVALID_ARGUMENT, "replica_id"),
            (
                stub.ReportVersion(pb.ReportVersionRequest(replica_id="r", version=-1)),
                grpc.StatusCode.INVALID_ARGUMENT,
                ">= 0",
            ),
        ]
        for call, code, text in cases:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == code and text in err.value.details()
        for request, code in [
            (pb.FetchRequest(version=-1), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.FetchRequest(version=0), grpc.StatusCode.NOT_FOUND),
            (pb.FetchRequest(version=5), grpc.StatusCode.NOT_FOUND),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                [m async for m in stub.Fetch(request)]
            assert err.value.code() == code
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [m async for m in stub.Subscribe(pb.SubscribeRequest())]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_negative_held_version_is_refused_and_replica_listing_keeps_working():
    # Found by `relayrl fuzz`: a subscription at a negative version entered the version table,
    # its lag overflowed int64 and every later ListReplicas failed with UNKNOWN.
    async with running_service() as (address, _), grpc_channel(address) as channel:
        stub = pb_grpc.ParamSyncStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [m async for m in stub.Subscribe(pb.SubscribeRequest(replica_id="r", held_version=-(2**63)), timeout=5)]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "held_version" in err.value.details()
        listing = await stub.ListReplicas(pb.ListReplicasRequest())
        assert all(r.replica_id != "r" for r in listing.replicas)


async def test_a_subscription_outlives_a_paramsync_restart_and_resumes_after_its_last_version():
    port = free_port()
    async with ParamSyncClient(f"127.0.0.1:{port}", sync_retry_delay=0.1) as ps:
        announcements = ps.subscribe("r0")
        async with running_service(port=port):
            await ps.publish(1, weights(1))
            assert (await asyncio.wait_for(anext(announcements), 10)).version == 1
        # Paramsync is gone: the subscription keeps trying, and the caller just waits.
        following = asyncio.ensure_future(anext(announcements))
        await asyncio.sleep(0.5)  # several reconnect attempts fail meanwhile
        assert not following.done()
        async with running_service(port=port), ParamSyncClient(f"127.0.0.1:{port}") as trainer:
            # The new instance announces its versions from the one the subscription already gave on.
            # A client of its own publishes: the subscription's channel may still be in gRPC's
            # reconnect backoff, which outlasted the short publish retries set above on a loaded machine.
            await trainer.publish(1, weights(1))
            await trainer.publish(2, weights(2))
            assert (await asyncio.wait_for(following, 15)).version == 2
            await announcements.aclose()  # the caller stops listening: the generator closes cleanly
