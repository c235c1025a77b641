"""``share_weights_by_handle`` on the trainer's side, with a real paramsync: a publish carries
handles whose memory holds exactly the bytes paramsync stores, tensors split across gather
buckets included; the two slots alternate; and a slot an engine may still read (a replica has not
reported its version) is never rewritten: that version goes as bytes only."""

from __future__ import annotations

import asyncio

import torch

from relayrl.models.loading import load_causal_lm
from services.engine.tensor_updates import named_tensors
from services.paramsync.client import ParamSyncClient
from services.paramsync.manifest import Announcement
from services.trainer.gather import BucketGather, published_items
from services.trainer.links import IoThread, Publisher
from services.trainer.trainer import stream_weights
from services.trainer.weight_handles import HandleSlots
from tests.integration.paramsync.harness import running_service

# Smaller than most of the tiny model's tensors: they come from the gather in row ranges.
BUCKET_BYTES = 4 * 1024


def opened(ann: Announcement) -> dict[str, torch.Tensor]:
    assert ann.handles is not None
    tensors: dict[str, torch.Tensor] = {}
    for payload in ann.handles.buckets:
        tensors.update({name: t.clone() for name, t in named_tensors([payload], ann.handles.load_format).items()})
    return tensors


def assert_bit_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name].view(torch.uint8), tensor.contiguous().view(torch.uint8)), name


async def _client(address: str) -> ParamSyncClient:
    return ParamSyncClient(address)


async def test_handles_hold_the_published_bytes_and_a_slot_still_read_is_not_rewritten(
    tiny_model_dir, file_system_sharing
):
    model = load_causal_lm(tiny_model_dir)
    gather = BucketGather(BUCKET_BYTES, dtype=torch.bfloat16)
    slots = HandleSlots(torch.device("cpu"))
    io = IoThread()
    try:
        async with running_service() as (address, _), ParamSyncClient(address) as replica:
            publisher = Publisher(io, io.call(_client(address)))
            announcements = replica.subscribe("r0")

            async def publish(version: int) -> tuple[dict[str, float], Announcement]:
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1.01)
                metrics = await asyncio.to_thread(stream_weights, model, gather, publisher, version, version, slots)
                ann = await asyncio.wait_for(anext(announcements), 20)
                assert ann.version == version
                return metrics, ann

            def expected() -> dict[str, torch.Tensor]:
                return {name: t.detach().to(torch.bfloat16) for name, t in published_items(model)}

            metrics, v1 = await publish(1)
            want_v1 = expected()
            assert metrics["trainer/weights_shared_by_handle"] == 1.0
            assert max(t.numel() * 2 for t in want_v1.values()) > 4 * BUCKET_BYTES, "tensors span gather buckets"
            assert_bit_equal(opened(v1), want_v1)
            assert_bit_equal(await replica.fetch(1), want_v1)

            # The other slot was never written: version 2 takes it though r0 reported nothing.
            _, v2 = await publish(2)
            want_v2 = expected()
            assert_bit_equal(opened(v2), want_v2)

            # Version 1's slot is next, but r0 has not reported holding version 1: it may still be
            # reading it, so version 3 goes as bytes only and version 1's memory stays as it was.
            metrics, v3 = await publish(3)
            assert metrics["trainer/weights_shared_by_handle"] == 0.0 and v3.handles is None
            assert_bit_equal(opened(v1), want_v1)
            assert_bit_equal(await replica.fetch(3), expected())

            # Once r0 holds version 2, nothing reads version 1's slot: version 4 is written into it.
            await replica.report_version("r0", 2)
            _, v4 = await publish(4)
            assert_bit_equal(opened(v4), expected())
            assert_bit_equal(opened(v2), want_v2)
            await announcements.aclose()
            publisher.drain()
            assert all(r.ok for r in publisher.records)
    finally:
        io.stop()
