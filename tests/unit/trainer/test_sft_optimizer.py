"""`relayrl sft`'s optimizer: the betas, eps and learning-rate schedule of its settings are those
its AdamW steps with, over the run's planned steps."""

import math

import pytest
import torch

from services.trainer.sft.config import SftSettings
from services.trainer.sft.run import plan_schedule, sft_optimizer

LR = 1e-3


def rates(**settings) -> tuple[torch.optim.Optimizer, list[float]]:
    """The optimizer of a 10-step run (20 rows, 2 a step) and the rate each of its updates used."""
    s = SftSettings(model_dir="m", data="d", out_dir="o", lr=LR, train_batch_size=2, micro_batch_size_per_gpu=1,
                    lr_warmup_steps_ratio=0.2, **settings)  # fmt: skip
    model = torch.nn.Linear(2, 1)
    opt, sched = sft_optimizer(model, s, plan_schedule(s, num_examples=20, world_size=1))
    used = []
    for _ in range(10):
        model(torch.ones(1, 2)).sum().backward()
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return opt, used


def test_by_default_the_rate_warms_up_then_stays_with_torchs_betas():
    opt, used = rates()
    assert used == pytest.approx([LR / 3, 2 * LR / 3] + [LR] * 8)
    assert (opt.param_groups[0]["betas"], opt.param_groups[0]["eps"]) == ((0.9, 0.999), 1e-8)


def test_verls_sft_recipe_decays_along_a_cosine_with_its_betas():
    opt, used = rates(betas=(0.9, 0.95), adam_eps=1e-6, lr_scheduler_type="cosine", min_lr_ratio=0.1)
    cosine = [LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 8))) for k in range(8)]
    assert used == pytest.approx([LR / 3, 2 * LR / 3, *cosine])
    assert (opt.param_groups[0]["betas"], opt.param_groups[0]["eps"]) == ((0.9, 0.95), 1e-6)
