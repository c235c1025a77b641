"""``relayrl sft --device cuda`` (`make test-gpu`): supervised fine-tuning on the GPU lowers the
loss, logs every step and writes a directory that loads with trained weights, as on the CPU."""

from __future__ import annotations

import pytest
import torch

from relayrl.models.loading import load_causal_lm
from tests.integration.trainer.test_sft import STEPS, run_sft, write_data

pytestmark = pytest.mark.gpu


def test_sft_on_cuda_lowers_the_loss_and_writes_trained_weights(tiny_model_dir, tmp_path):
    data = tmp_path / "train.jsonl"
    write_data(data)
    # A GPU host's first import of torch took 35 s from a cold disk, and the job compiles its log-prob statistics.
    metrics = run_sft(tiny_model_dir, data, tmp_path / "tuned", nproc=1, steps=STEPS, device="cuda", timeout_s=300)
    losses = [m["train/loss"] for m in metrics]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert max(losses[-2:]) < 0.7 * losses[0], losses
    tuned = load_causal_lm(tmp_path / "tuned").state_dict()
    base = load_causal_lm(tiny_model_dir).state_dict()
    assert tuned.keys() == base.keys()
    assert any(not torch.equal(tuned[name], base[name]) for name in base)
