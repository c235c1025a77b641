"""A publish from 2 FSDP ranks streams bucket by bucket into a real paramsync: the version is the
trained state dict bit for bit, and rank 0 never holds more than two buckets of gathered bytes."""

from __future__ import annotations

import asyncio

import torch

from services.paramsync.client import ParamSyncClient
from tests.integration.paramsync.harness import running_service
from tests.integration.trainer.harness import run_logged, torchrun

BUCKET_BYTES = 64 * 1024


async def test_two_ranks_publish_bucket_by_bucket_and_the_version_is_the_state_dict(tiny_model_dir, tmp_path):
    out = tmp_path / "published.pt"
    async with running_service() as (address, _), ParamSyncClient(address) as ps:
        cmd = torchrun(
            2, "tests.integration.trainer.publish_worker", str(tiny_model_dir), address, str(BUCKET_BYTES), str(out)
        )
        await asyncio.to_thread(run_logged, cmd, tmp_path / "publish.log")
        fetched = await ps.fetch_version(1)
    saved = torch.load(out, weights_only=False)
    weights = saved["weights"]
    assert list(fetched.tensors) == list(weights)
    for name, tensor in weights.items():
        got = fetched.tensors[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got.view(torch.uint8), tensor.contiguous().view(torch.uint8)), name
    model_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    largest = max(t.numel() * t.element_size() for t in weights.values())
    # A bucket closes at the first tensor that fills it, so it holds < BUCKET_BYTES + largest.
    assert saved["peak"] <= 2 * (BUCKET_BYTES + largest)
    assert model_bytes > 4 * (BUCKET_BYTES + largest)  # else the bound would prove nothing
    assert saved["metrics"]["timing/gather_s"] > 0
