"""A 2-process gloo FSDP2 run takes the same steps as a 1-process run on the same seed and data."""

import pytest
import torch

from tests.integration.trainer.harness import run_logged, torchrun

STEPS = 3


def _run(nproc: int, model_dir, out) -> dict:
    cmd = torchrun(nproc, "tests.integration.trainer.fsdp_worker", str(model_dir), str(out), str(STEPS))
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
