"""adam_eps: with torch's 1e-8 a near-zero gradient moves a weight as far as a large one (about lr);
with PPO's 1e-5 it moves it by a share of lr that shrinks with the gradient."""

import pytest
import torch

from services.trainer import distributed as D
from services.trainer.config import TrainerSettings
from services.trainer.model import AdamW, LrSchedule, build_optimizer
from services.trainer.trainer import build_models

LR = 1e-3


def _moved(grad: float, eps: float) -> float:
    """How far one AdamW step with gradient ``grad`` moves a weight."""
    weight = torch.nn.Parameter(torch.zeros(1))
    opt, _ = build_optimizer(torch.nn.ParameterList([weight]), AdamW(LR, eps=eps), LrSchedule())
    weight.grad = torch.full((1,), grad)
    opt.step()
    return abs(float(weight.detach()))


def test_a_near_zero_gradient_moves_a_weight_by_lr_at_1e_8_and_far_less_at_1e_5():
    assert _moved(1e-6, 1e-8) == pytest.approx(LR, rel=0.02)
    assert _moved(1e-6, 1e-5) < LR / 10
    assert _moved(1e-2, 1e-5) == pytest.approx(LR, rel=0.01)  # a real signal keeps its full step


def test_the_trainer_steps_with_the_configured_eps(tiny_model_dir):
    models = build_models(TrainerSettings(model_dir=tiny_model_dir, adam_eps=1e-5), D.local_context(), fsdp=False)
    assert {g["eps"] for g in models.actor_opt.param_groups} == {1e-5}
