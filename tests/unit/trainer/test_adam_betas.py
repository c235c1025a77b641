"""adam_betas (verl optim.betas, OpenRLHF's --adam_betas): set from the config or the environment,
checked at start, and what the trainer's optimizer steps with."""

import pytest
import torch
from pydantic import ValidationError

from services.trainer import distributed as D
from services.trainer.config import TrainerSettings
from services.trainer.model import AdamW, LrSchedule, build_optimizer
from services.trainer.trainer import build_models

LR = 1e-3


def _step_after_the_gradient_shrinks(betas: tuple[float, float]) -> float:
    """How far a weight moves in the 300th step after its gradient went from 1 (200 steps) to 0.01."""
    weight = torch.nn.Parameter(torch.zeros(1))
    opt, _ = build_optimizer(torch.nn.ParameterList([weight]), AdamW(LR, betas=betas), LrSchedule())
    for step in range(500):
        before = float(weight.detach())
        weight.grad = torch.full((1,), 1.0 if step < 200 else 0.01)
        opt.step()
    return abs(float(weight.detach()) - before)


def test_the_second_beta_sets_how_soon_the_step_follows_a_smaller_gradient():
    # 1/(1 - beta2) steps of memory: 20 at 0.95, so 300 steps later the step is lr again; 1,000 at
    # torch's 0.999, so the old gradients still hold it near lr/100.
    assert _step_after_the_gradient_shrinks((0.9, 0.95)) == pytest.approx(LR, rel=0.05)
    assert _step_after_the_gradient_shrinks((0.9, 0.999)) < LR / 50


@pytest.mark.parametrize("value", ["0.9,0.95", "[0.9, 0.95]", " 0.9 , 0.95 "])
def test_the_environment_takes_json_or_two_numbers(monkeypatch, tmp_path, value):
    monkeypatch.setenv("RELAYRL_TRAINER_ADAM_BETAS", value)
    assert TrainerSettings(model_dir=tmp_path).adam_betas == (0.9, 0.95)


@pytest.mark.parametrize("value", ["0.9,1.0", "0.9", "-0.1,0.9", "0.9,0.95,0.99"])
def test_a_bad_value_is_refused_naming_the_setting(monkeypatch, tmp_path, value):
    monkeypatch.setenv("RELAYRL_TRAINER_ADAM_BETAS", value)
    with pytest.raises(ValidationError, match="adam_betas"):
        TrainerSettings(model_dir=tmp_path)


def test_the_trainer_steps_with_the_configured_betas(tiny_model_dir):
    settings = TrainerSettings(model_dir=tiny_model_dir, adam_betas=(0.9, 0.95), adv_estimator="gae")
    models = build_models(settings, D.local_context(), fsdp=False)
    for opt in (models.actor_opt, models.critic_opt):
        assert {tuple(g["betas"]) for g in opt.param_groups} == {(0.9, 0.95)}
