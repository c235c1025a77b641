"""verl's learning-rate schedules as the trainer's optimizer applies them, update by update."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from services.trainer.config import TrainerSettings
from services.trainer.model import AdamW, LrSchedule, build_optimizer


def _rates(schedule: LrSchedule, lr: float, updates: int) -> list[float]:
    """The learning rate each of ``updates`` optimizer steps ran with."""
    model = torch.nn.Linear(2, 1)
    opt, sched = build_optimizer(model, AdamW(lr), schedule)
    rates = []
    for _ in range(updates):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def test_constant_after_a_linear_warm_up() -> None:
    assert _rates(LrSchedule(warmup_steps=3), 1.0, 6) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_cosine_falls_from_lr_to_the_floor_at_the_last_step_and_stays_there() -> None:
    rates = _rates(LrSchedule(warmup_steps=2, kind="cosine", total_steps=12, min_lr_ratio=0.1), 2.0, 14)
    assert rates[:3] == pytest.approx([2 / 3, 4 / 3, 2.0])
    # Halfway through the decay: the mean of lr and the floor.
    assert rates[7] == pytest.approx(0.1 * 2.0 + 0.9 * 2.0 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a > b for a, b in itertools.pairwise(rates[2:13]))
    assert rates[12:] == pytest.approx([0.2, 0.2])


def test_the_settings_take_verls_names_and_refuse_other_schedules() -> None:
    s = TrainerSettings(lr_scheduler_type="cosine", min_lr_ratio=0.1)
    assert (s.lr_scheduler_type, s.min_lr_ratio) == ("cosine", 0.1)
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        TrainerSettings(lr_scheduler_type="linear")
