from __future__ import annotations

import os

import pytest

from relayrl.config import SettingsError, load_settings
from services.engine.config import EngineSettings


def test_torch_threads_default_to_the_cpus_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELAYRL_ENGINE_TORCH_THREADS", raising=False)
    settings = load_settings(EngineSettings)
    assert settings.torch_threads == 0
    assert settings.resolved_torch_threads() == len(os.sched_getaffinity(0))


def test_an_explicit_torch_thread_count_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYRL_ENGINE_TORCH_THREADS", "3")
    assert load_settings(EngineSettings).resolved_torch_threads() == 3


def test_a_negative_torch_thread_count_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYRL_ENGINE_TORCH_THREADS", "-1")
    with pytest.raises(SettingsError, match="RELAYRL_ENGINE_TORCH_THREADS"):
        load_settings(EngineSettings)
