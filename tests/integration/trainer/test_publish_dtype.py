"""``rollout_dtype``: a bf16 publish from 2 FSDP ranks reaches paramsync and an engine's weight loader
as the bf16 cast of the trained fp32 weights, byte for byte, in half the bytes; an fp32 publish is
the trained weights themselves. The engine side is the rollout's path: the version received into
a file (``fetch_to_file``), read and applied by the engine's own loader (``services.engine.weights``)
to a model loaded in the engine's dtype. Shared by handle as well, the bf16 version's slot holds
the same bytes."""

from __future__ import annotations

import asyncio

import torch

from relayrl.models.loading import load_causal_lm
from services.engine.weights import apply_tensors, read_safetensors_dir
from services.paramsync.client import ParamSyncClient
from services.paramsync.memfile import VersionFiles
from tests.integration.paramsync.harness import running_service
from tests.integration.trainer.harness import run_logged, torchrun


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


async def test_a_bf16_publish_is_the_cast_of_the_trained_weights_at_paramsync_and_in_the_engine(
    tiny_model_dir, tmp_path
):
    out = tmp_path / "published.pt"
    async with running_service() as (address, _), ParamSyncClient(address) as ps:
        cmd = torchrun(2, "tests.integration.trainer.publish_dtype_worker", str(tiny_model_dir), address, str(out))
        await asyncio.to_thread(run_logged, cmd, tmp_path / "publish.log")
        fetched = {v: await ps.fetch_version(v) for v in (1, 2)}
        files = VersionFiles(tmp_path / "versions")
        # Read while paramsync serves: on its host a version's directory links to paramsync's memory.
        received = {v: read_safetensors_dir(await ps.fetch_to_file(v, files)) for v in (1, 2)}
    saved = torch.load(out, weights_only=False)
    assert saved["metrics"]["bf16"]["shared"], "both ranks on this host: the cast follows the shared-memory gather"
    weights, published = saved["weights"], saved["published"]
    assert all(weights[n].dtype == torch.float32 for n in published), "the master weights stay fp32"

    fp32, bf16 = fetched[1], fetched[2]
    assert list(fp32.tensors) == list(bf16.tensors) == published
    for name in published:
        assert fp32.tensors[name].dtype == torch.float32, name
        assert torch.equal(_bytes(fp32.tensors[name]), _bytes(weights[name])), name
        assert bf16.tensors[name].dtype == torch.bfloat16, name
        assert torch.equal(_bytes(bf16.tensors[name]), _bytes(weights[name].to(torch.bfloat16))), name
    assert bf16.manifest.total_bytes * 2 == fp32.manifest.total_bytes
    # Shared by handle too, the slot assembled from the FSDP gather's row ranges holds the same bytes.
    by_handle = saved["by_handle"]
    assert list(by_handle) == published
    for name in published:
        assert torch.equal(_bytes(by_handle[name]), _bytes(bf16.tensors[name])), name
    assert {s.dtype for s in bf16.manifest.tensors} == {"bfloat16"}

    # The engine's loader, in each engine dtype, holds the version as sent.
    for version, dtype in ((1, torch.float32), (2, torch.bfloat16)):
        engine_model = load_causal_lm(tiny_model_dir, dtype=str(dtype).removeprefix("torch."))
        applied = apply_tensors(engine_model, received[version])
        assert applied == len(published)
        state = engine_model.state_dict()
        for name in published:
            want = weights[name].to(dtype)
            assert state[name].dtype == dtype and torch.equal(_bytes(state[name]), _bytes(want)), (version, name)
        # The tied output head follows the embedding it is.
        assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])
