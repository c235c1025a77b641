"""A 2-process gloo FSDP2 run takes the same steps as a 1-process run on the same seed and data;
a bf16 run (param_dtype) takes nearly the same steps, computed in bf16, with fp32 master weights."""

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.trainer.harness import run_logged, torchrun

STEPS = 3


def _run(nproc: int, model_dir, out, *extra: str) -> dict:
    cmd = torchrun(nproc, "tests.integration.trainer.fsdp_worker", str(model_dir), str(out), str(STEPS), *extra)
    run_logged(cmd, out.with_suffix(".log"))
    return torch.load(out, weights_only=False)


def test_two_ranks_match_one_rank(tiny_model_dir, tmp_path):
    one = _run(1, tiny_model_dir, tmp_path / "one.pt")
    two = _run(2, tiny_model_dir, tmp_path / "two.pt")
    for step, (a, b) in enumerate(zip(one["history"], two["history"], strict=True)):
        for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm", "actor/pg_clipfrac"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (step, key)
    assert one["weights"].keys() == two["weights"].keys()
    for name, w in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], w, rtol=1e-4, atol=1e-5, msg=name)
    # the run really moved the weights (else matching would prove nothing)
    first = one["history"][0]
    assert first["actor/grad_norm"] > 0 and one["history"][-1]["actor/pg_loss"] != first["actor/pg_loss"]


def test_bf16_compute_on_cpu_follows_fp32_with_fp32_master_weights(tiny_model_dir, tmp_path):
    fp32 = _run(1, tiny_model_dir, tmp_path / "fp32.pt")
    bf16 = _run(1, tiny_model_dir, tmp_path / "bf16.pt", "bf16")
    for step, (a, b) in enumerate(zip(fp32["history"], bf16["history"], strict=True)):
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=0.05, abs=1e-3), (step, key)
    # The forward really ran in bf16: its entropy differs from fp32's in the bf16 digits.
    assert [h["actor/entropy"] for h in bf16["history"]] != [h["actor/entropy"] for h in fp32["history"]]
    # fp32 master weights, moved by the bf16 run in the direction the fp32 run moved them.
    initial = load_file(tiny_model_dir / "model.safetensors")
    names = sorted(n for n in initial if n in fp32["weights"])
    assert names and all(bf16["weights"][n].dtype == torch.float32 for n in names)
    moved_fp32 = torch.cat([(fp32["weights"][n] - initial[n]).flatten() for n in names])
    moved_bf16 = torch.cat([(bf16["weights"][n] - initial[n]).flatten() for n in names])
    assert moved_bf16.norm() > 0
    assert torch.nn.functional.cosine_similarity(moved_bf16, moved_fp32, dim=0) > 0.9
