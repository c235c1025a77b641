"""The model reward's arithmetic and settings: a weighted sum with both parts kept, and no model
reward without a service to ask."""

from __future__ import annotations

import pytest

from relayrl.config import SettingsError, load_settings
from services.rollout.config import RolloutSettings
from services.rollout.rewards import RewardOutcome
from services.rollout.rewards.model import combine


def test_rule_plus_model_is_the_weighted_sum_with_both_parts_kept() -> None:
    outcome = combine(RewardOutcome(1.0, {"acc": 1.0}), 0.25, rule_weight=0.5, model_weight=2.0)
    assert outcome.reward == pytest.approx(1.0)
    assert outcome.extra == {"acc": 1.0, "rule_score": 1.0, "model_score": 0.25}


def test_a_rule_error_stays_visible_in_the_sum() -> None:
    outcome = combine(RewardOutcome(0.0, error="timed out"), 0.5, rule_weight=1.0, model_weight=1.0)
    assert outcome.error == "timed out" and outcome.reward == 0.5


def test_model_alone_is_the_weighted_score() -> None:
    outcome = combine(None, -0.5, rule_weight=1.0, model_weight=3.0)
    assert outcome.reward == -1.5 and outcome.extra == {"model_score": -0.5} and not outcome.error


def test_a_model_reward_needs_the_service_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYRL_ROLLOUT_REWARD_KIND", "model")
    with pytest.raises(SettingsError, match="RELAYRL_ROLLOUT_REWARD_MODEL_URL"):
        load_settings(RolloutSettings)
    monkeypatch.setenv("RELAYRL_ROLLOUT_REWARD_MODEL_URL", "http://reward:8090")
    settings = load_settings(RolloutSettings)
    assert settings.reward_kind == "model" and settings.reward_model_url == "http://reward:8090"
