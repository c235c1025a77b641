"""A version the trainer also shares by handle, through a real paramsync: it is announced once all
its bytes are in (the handles' memory is whole by then), with the trainer's handles; until then
subscribers are told of the version before it; and the bytes are stored and served as always,
without the handles in the manifest a replica fetches."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import torch

from services.paramsync.client import ParamSyncClient
from services.paramsync.manifest import WeightHandles
from services.paramsync.tensors import as_pairs, open_specs
from tests.integration.paramsync.harness import running_service
from tests.integration.paramsync.test_streamed_uploads import assert_bit_equal, version_tensors
from tests.waiting import wait_until_async

HANDLES = WeightHandles("trainer-host", "flattened_bucket", ("first-bucket-payload", "second-bucket-payload"))


@pytest.mark.parametrize("data_plane", [True, False], ids=["dataplane", "grpc"])
async def test_a_version_shared_by_handle_is_announced_with_its_handles_once_its_bytes_are_in(data_plane):
    tensors = version_tensors(2)
    pairs = as_pairs(tensors)
    first_sent, go_on = asyncio.Event(), asyncio.Event()

    async def buckets() -> AsyncIterator[list[torch.Tensor]]:
        yield [t for _, t in pairs[:2]]
        first_sent.set()
        await go_on.wait()
        yield [t for _, t in pairs[2:]]

    async with (
        running_service(data_plane=data_plane) as (address, service),
        ParamSyncClient(address) as trainer,
        ParamSyncClient(address) as replica,
    ):
        await trainer.publish(1, version_tensors(1))
        announcements = replica.subscribe("r0", held_version=1)
        first = asyncio.ensure_future(anext(announcements))
        upload = asyncio.ensure_future(trainer.publish_streamed(2, open_specs(pairs), buckets(), handles=HANDLES))
        await asyncio.wait_for(first_sent.wait(), 10)
        await wait_until_async(lambda: service.store.uploading is not None and service.store.uploading.received > 0)
        # Mid-upload, a version shared by handle is not announced (a plain one would be, to be
        # fetched as it arrives: the first announcement below would lack the handles), and a
        # replica that joins now is told of the version before it.
        done, _ = await asyncio.wait({first}, timeout=0.5)  # an announcement at upload start takes milliseconds
        assert not done, "announced before its bytes were in"
        assert service.current_announcement().version == 1
        assert service.current_announcement().handles is None
        go_on.set()
        await asyncio.wait_for(upload, 10)
        announced = await asyncio.wait_for(first, 10)
        assert (announced.version, announced.transport, announced.handles) == (2, "grpc", HANDLES)
        late = replica.subscribe("r1")
        assert (await asyncio.wait_for(anext(late), 10)).handles == HANDLES
        fetched = await replica.fetch_version(2)
        assert fetched.manifest.handles is None
        assert_bit_equal(fetched.tensors, tensors)
        await announcements.aclose()
        await late.aclose()


async def test_a_plain_version_after_one_shared_by_handle_is_announced_as_its_upload_begins():
    async with running_service() as (address, _), ParamSyncClient(address) as trainer, ParamSyncClient(address) as r:
        await trainer.publish(1, version_tensors(1), handles=HANDLES)
        announcements = r.subscribe("r0", held_version=1)
        pairs = as_pairs(version_tensors(2))
        released = asyncio.Event()

        async def buckets() -> AsyncIterator[list[torch.Tensor]]:
            yield [t for _, t in pairs[:2]]
            await released.wait()
            yield [t for _, t in pairs[2:]]

        upload = asyncio.ensure_future(trainer.publish_streamed(2, open_specs(pairs), buckets()))
        announced = await asyncio.wait_for(anext(announcements), 10)
        assert (announced.version, announced.handles) == (2, None)
        assert not upload.done()
        released.set()
        await asyncio.wait_for(upload, 10)
        await announcements.aclose()
