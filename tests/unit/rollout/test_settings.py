from __future__ import annotations

import pytest

from relayrl.config import SettingsError, load_settings
from services.engine.config import EngineSettings
from services.rollout.config import RolloutSettings


def test_rollout_settings_read_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYRL_ROLLOUT_PARTIAL_ROLLOUT_MODE", "in_place")
    monkeypatch.setenv("RELAYRL_MAX_STALENESS", "3")
    settings = load_settings(RolloutSettings)
    assert settings.partial_rollout_mode == "in_place" and settings.max_staleness == 3


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RELAYRL_ROLLOUT_PARTIAL_ROLLOUT_MODE", "sometimes"),
        ("RELAYRL_ROLLOUT_MAX_INFLIGHT_PROMPTS", "0"),
        ("RELAYRL_ROLLOUT_TOP_P", "0"),
    ],
)
def test_bad_rollout_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=variable):
        load_settings(RolloutSettings)


def test_engine_settings_refuse_unknown_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYRL_ENGINE_DTYPE", "float8")
    with pytest.raises(SettingsError, match="RELAYRL_ENGINE_DTYPE"):
        load_settings(EngineSettings)
