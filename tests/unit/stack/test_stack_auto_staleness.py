"""`stack.max_staleness: auto` in a stack config: the trainer alone picks η, every other service holds the limit."""

from __future__ import annotations

import os

import pytest

from commands.stack.config import StackConfig
from commands.stack.launch import LocalStack
from commands.stack.supervisor import Supervisor
from services.rollout.config import RolloutSettings
from services.trainer.config import TrainerSettings


def _settings(env: dict[str, str], model: type, monkeypatch: pytest.MonkeyPatch):
    for key in [k for k in os.environ if k.startswith("RELAYRL_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return model()


def test_auto_gives_the_trainer_auto_and_every_other_service_the_limit(monkeypatch):
    config = StackConfig.model_validate({"stack": {"max_staleness": "auto", "max_staleness_limit": 3}})
    assert config.stack.staleness_bound == 3
    env = LocalStack(config, Supervisor(None))._shared_env()
    trainer = _settings(env, TrainerSettings, monkeypatch)
    assert (trainer.max_staleness, trainer.max_staleness_limit) == ("auto", 3)
    assert _settings(env, RolloutSettings, monkeypatch).max_staleness == 3


def test_a_fixed_eta_reaches_every_service_and_a_trainer_section_still_wins(monkeypatch):
    config = StackConfig.model_validate({"stack": {"max_staleness": 2}, "trainer": {"max_staleness": 0}})
    env = {**LocalStack(config, Supervisor(None))._shared_env(), **config.section_env("trainer")}
    assert "RELAYRL_TRAINER_MAX_STALENESS_LIMIT" not in LocalStack(config, Supervisor(None))._shared_env()
    assert _settings(env, TrainerSettings, monkeypatch).max_staleness == 0
    assert _settings(env, RolloutSettings, monkeypatch).max_staleness == 2
