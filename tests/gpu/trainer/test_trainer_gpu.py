"""The trainer on a GPU (`make test-gpu`; skipped with the reason where torch sees no CUDA device).

Each test runs the trainer's own code path in a torchrun job of one rank on the GPU (NCCL, FSDP2,
bf16 compute unless said otherwise), through tests/gpu/trainer/worker.py:

- a GRPO and a PPO step on CUDA take the fp32 CPU step, within bf16's tolerance;
- publish → paramsync → fetch: the version is the bf16 cast of the trained weights byte for byte
  (the NCCL gather, the cast on the GPU, pinned staging on a copy stream, the streamed upload);
- a LoRA step on CUDA publishes the trained adapter alone, as the bf16 cast of its weights;
- a checkpoint taken on CUDA and resumed in a new process continues bit for bit;
- ``base`` (Qwen2.5-0.5B's shape) trains 20 steps of a long-tailed batch, each followed by a
  publish's gather, with allocated memory flat after the second and nothing compiled after the
  start-up warm-up (each packed length is a symbol of its graphs);
- use_torch_compile, use_remove_padding and enable_gradient_checkpointing change no loss (fp32).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from safetensors.torch import load_file

from services.paramsync.client import ParamSyncClient
from tests.integration.paramsync.harness import running_service
from tests.integration.trainer.harness import run_logged, torchrun

pytestmark = pytest.mark.gpu


def _run(tmp_path, name: str, kind: str, *args: str, timeout_s: float = 300) -> dict:
    out = tmp_path / f"{name}.pt"
    cmd = torchrun(1, "tests.gpu.trainer.worker", kind, str(out), *args)
    run_logged(cmd, tmp_path / f"{name}.log", timeout_s=timeout_s)
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_a_step_on_cuda_takes_the_fp32_cpu_step_within_bf16_tolerance(tiny_model_dir, tmp_path, estimator):
    cpu = _run(tmp_path, "cpu", "step", "cpu", str(tiny_model_dir), estimator)
    cuda = _run(tmp_path, "cuda", "step", "cuda", str(tiny_model_dir), estimator)
    keys = ["actor/pg_loss", "actor/entropy", "actor/grad_norm"]
    keys += ["critic/vf_loss", "critic/grad_norm"] if estimator == "gae" else []
    for key in keys:
        assert cuda["metrics"][key] == pytest.approx(cpu["metrics"][key], rel=0.05, abs=1e-3), key
    # fp32 master weights on CUDA too, moved by the bf16 step the way the fp32 step moved them.
    initial = load_file(tiny_model_dir / "model.safetensors")
    names = sorted(n for n in initial if n in cpu["weights"])
    assert names and all(cuda["weights"][n].dtype == torch.float32 for n in names)
    moved_cpu = torch.cat([(cpu["weights"][n] - initial[n]).flatten() for n in names])
    moved_cuda = torch.cat([(cuda["weights"][n].cpu() - initial[n]).flatten() for n in names])
    assert moved_cuda.norm() > 0
    assert torch.nn.functional.cosine_similarity(moved_cuda, moved_cpu, dim=0) > 0.9
    assert cuda["metrics"]["actor/grad_norm"] > 0


def test_publish_fetch_on_cuda_gives_the_bf16_cast_of_the_trained_bytes(tiny_model_dir, tmp_path):
    async def publish_and_fetch():
        async with running_service() as (address, _), ParamSyncClient(address) as ps:
            saved = await asyncio.to_thread(
                _run, tmp_path, "publish", "publish", str(tiny_model_dir), address, str(16 * 1024)
            )
            return saved, await ps.fetch_version(1)

    saved, fetched = asyncio.run(publish_and_fetch())
    assert saved["staging"] == "CudaStaging"
    assert saved["dtype"] == torch.bfloat16  # rollout_dtype auto on cuda, as the engine's dtype auto
    weights = saved["weights"]
    assert list(fetched.tensors) == [n for n in weights if n != "lm_head.weight"]  # tied: sent once
    for name, got in fetched.tensors.items():
        # The fp32 master weights cast on the GPU: the same bytes as a cast on the CPU.
        want = weights[name].cpu().to(torch.bfloat16).contiguous()
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), name
    assert saved["peak"] <= 3 * 16 * 1024  # the upload's bucket, the handed-on one, the staged one


def test_a_lora_step_on_cuda_publishes_the_trained_adapter_alone(tiny_model_dir, tmp_path):
    async def publish_and_fetch():
        async with running_service() as (address, _), ParamSyncClient(address) as ps:
            saved = await asyncio.to_thread(_run, tmp_path, "lora", "lora", str(tiny_model_dir), address)
            return saved, await ps.fetch_version(1)

    saved, fetched = asyncio.run(publish_and_fetch())
    adapter = saved["adapter"]
    assert adapter and all("lora_" in name for name in adapter)
    assert list(fetched.tensors) == list(adapter)
    for name, got in fetched.tensors.items():
        want = adapter[name].cpu().to(torch.bfloat16).contiguous()
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), name
    # lora_B starts at zero: the step on the GPU moved it.
    assert any(adapter[n].abs().sum() > 0 for n in adapter if "lora_B" in n)
    assert saved["metrics"]["actor/grad_norm"] > 0


def test_a_checkpoint_on_cuda_resumes_bit_for_bit(tiny_model_dir, tmp_path):
    root = tmp_path / "checkpoints"
    through = _run(tmp_path, "through", "resume", str(tiny_model_dir), str(root), "through")
    resumed = _run(tmp_path, "resumed", "resume", str(tiny_model_dir), str(root), "resumed")
    for a, b in zip(through["history"], resumed["history"], strict=True):
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert a[key] == b[key], key
    assert through["weights"].keys() == resumed["weights"].keys()
    for name, w in through["weights"].items():
        assert torch.equal(resumed["weights"][name], w), name


# The job's own time limit, not pytest's default 300 s (a first compile on a cold host takes minutes).
@pytest.mark.timeout(660)
def test_base_trains_twenty_steps_with_allocated_memory_flat_after_the_second_and_nothing_compiled_after_the_warm_up(
    tmp_path,
):
    from relayrl.models.tiny import init_tiny, preset_spec

    model_dir = init_tiny(tmp_path / "base", preset_spec("base", dtype="bfloat16"))
    seen = _run(tmp_path, "memory", "memory", str(model_dir), "20", timeout_s=600)
    allocated = seen["allocated"]
    assert len(allocated) == 20
    settled = allocated[2:]
    # Flat: nothing piles up step after step (a leaked bucket or graph would be tens of MB at least).
    assert max(settled) - min(settled) <= 32 * 1024 * 1024, [round(a / 2**20) for a in allocated]
    assert seen["peak"] >= max(allocated) > 0
    assert all(v == v for v in seen["losses"])  # finite (NaN != NaN)
    # flex_attention (compiled by transformers) and its block mask: the start-up warm-up built every
    # graph, and every packed length of the long-tailed batches is served by them.
    assert len(seen["graphs"]) == 21 and seen["graphs"][0] > 0
    assert set(seen["graphs"]) == {seen["graphs"][0]}, seen["graphs"]


# The job's own time limit, not pytest's default 300 s (a first compile on a cold host takes minutes).
@pytest.mark.timeout(660)
def test_the_switches_change_no_loss_on_cuda(tiny_model_dir, tmp_path):
    runs = _run(tmp_path, "switches", "switches", str(tiny_model_dir), timeout_s=600)
    eager = runs["eager"]
    for name in ("compiled", "padded", "checkpointed"):
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert runs[name][key] == pytest.approx(eager[key], rel=1e-4, abs=1e-5), (name, key)
    assert eager["perf/padding_ratio"] == 0.0 < runs["padded"]["perf/padding_ratio"]
