"""The publish as a GPU trainer runs it, on 2 gloo ranks: each bucket all-gathered on the group's
device (no shared host memory) and staged to the host one bucket behind the gather, as CUDA's copy
stream overlaps them. The version paramsync serves is the trained state dict bit for bit; each bucket
is handed to the upload only once the next one is staged, and rank 0 holds at most three buckets of
gathered bytes (the one uploading, the one handed on, the one staged)."""

from __future__ import annotations

import asyncio
import itertools

import torch

from services.paramsync.client import ParamSyncClient
from tests.integration.paramsync.harness import running_service
from tests.integration.trainer.harness import run_logged, torchrun

BUCKET_BYTES = 16 * 1024


async def test_a_publish_staged_behind_the_gather_is_the_state_dict_bit_for_bit(tiny_model_dir, tmp_path):
    out = tmp_path / "published.pt"
    async with running_service() as (address, _), ParamSyncClient(address) as ps:
        cmd = torchrun(
            2,
            "tests.integration.trainer.staged_publish_worker",
            str(tiny_model_dir),
            address,
            str(BUCKET_BYTES),
            str(out),
        )
        await asyncio.to_thread(run_logged, cmd, tmp_path / "publish.log")
        fetched = await ps.fetch_version(1)
    saved = torch.load(out, weights_only=False)
    weights = saved["weights"]
    assert list(fetched.tensors) == saved["published"]
    for name in saved["published"]:
        got, want = fetched.tensors[name], weights[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8)), name
    assert max(w.numel() * w.element_size() for w in weights.values()) >= 4 * BUCKET_BYTES
    sizes, events = saved["sizes"], saved["events"]
    published_bytes = sum(weights[n].numel() * weights[n].element_size() for n in saved["published"])
    assert len(sizes) >= 4 and sum(sizes) == published_bytes
    for index in range(len(sizes) - 1):
        assert events.index(("staged", index + 1)) < events.index(("handed", index)), events
    # Two neighbours are alive together whatever the upload's pace; more only while it lags.
    pairs = max(a + b for a, b in itertools.pairwise(sizes))
    assert pairs <= saved["peak"] <= 3 * BUCKET_BYTES
