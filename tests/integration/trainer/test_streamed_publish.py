"""A publish from 2 FSDP ranks streams bucket by bucket into a real paramsync: the version is the
trained state dict bit for bit (gathered through the ranks' shared memory, checked against an
all-gather), and rank 0 never holds more than two buckets of gathered bytes, even though most
tensors are larger than a bucket (they come in row ranges)."""

from __future__ import annotations

import asyncio

import torch

from services.paramsync.client import ParamSyncClient
from tests.integration.paramsync.harness import running_service
from tests.integration.trainer.harness import run_logged, torchrun

BUCKET_BYTES = 16 * 1024


async def test_two_ranks_publish_bucket_by_bucket_and_the_version_is_the_state_dict(tiny_model_dir, tmp_path):
    out = tmp_path / "published.pt"
    async with running_service() as (address, _), ParamSyncClient(address) as ps:
        cmd = torchrun(
            2, "tests.integration.trainer.publish_worker", str(tiny_model_dir), address, str(BUCKET_BYTES), str(out)
        )
        await asyncio.to_thread(run_logged, cmd, tmp_path / "publish.log")
        fetched = await ps.fetch_version(1)
    saved = torch.load(out, weights_only=False)
    assert saved["shared"], "both ranks run on this host: the publish gathers through shared memory"
    weights = saved["weights"]
    # Each tensor once: the tiny model ties lm_head to the embedding, so the version leaves it out
    # and the engine's tied copy follows the embedding.
    assert list(fetched.tensors) == saved["published"] == [n for n in weights if n != "lm_head.weight"]
    assert torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])
    for name in saved["published"]:
        tensor = weights[name]
        got = fetched.tensors[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got.view(torch.uint8), tensor.contiguous().view(torch.uint8)), name
    sizes = [weights[n].numel() * weights[n].element_size() for n in saved["published"]]
    largest = max(sizes)
    # No bucket holds more than BUCKET_BYTES, though most tensors are larger: they come in row ranges.
    assert largest >= 4 * BUCKET_BYTES
    assert saved["peak"] <= 2 * BUCKET_BYTES
    assert saved["metrics"]["timing/gather_s"] > 0
