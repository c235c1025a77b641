"""An attention backend whose kernels fail to build at the engine's start (a compiler bug of the
host's torch or Triton): auto's choice falls back to torch_native with the reason in the log, the
user's own choice stops the engine with one line naming the setting."""

from __future__ import annotations

import logging

import pytest

from relayrl.config import SettingsError
from services.engine.config import EngineSettings
from services.engine.state import runner_or_fallback


class Builds:
    """Builds a stand-in runner per backend, failing for ``failing`` as a compile error would."""

    def __init__(self, failing: str, error: Exception | None = None) -> None:
        self.failing, self.error, self.tried = failing, error, []

    def __call__(self, attention: str) -> str:
        self.tried.append(attention)
        if attention == self.failing:
            raise self.error or RuntimeError("InductorError: LoweringException: flex_attention")
        return f"runner over {attention}"


def cuda(attention_backend: str) -> EngineSettings:
    # No GPU here: the settings are built without their device check, as the bench's listing does.
    return EngineSettings.model_construct(device="cuda", attention_backend=attention_backend)


def test_autos_backend_that_fails_to_build_falls_back_to_torch_native_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    builds = Builds(failing="flex_attention")

    with caplog.at_level(logging.ERROR, logger="services.engine.state"):
        runner = runner_or_fallback(builds, cuda("auto"))

    assert runner == "runner over torch_native" and builds.tried == ["flex_attention", "torch_native"]
    assert "flex_attention attention backend failed to build at start; serving with torch_native" in caplog.text
    assert "LoweringException" in caplog.text


@pytest.mark.parametrize("chosen", ["flex_attention", "triton"])
def test_a_chosen_backend_that_fails_to_build_stops_the_engine_naming_the_setting(chosen: str) -> None:
    builds = Builds(failing=chosen)

    with pytest.raises(SettingsError) as err:
        runner_or_fallback(builds, cuda(chosen))

    assert builds.tried == [chosen]
    line = err.value.one_line()
    assert f"RELAYRL_ENGINE_ATTENTION_BACKEND={chosen}: its kernels failed to build at start" in line
    assert "LoweringException" in line


def test_a_refused_setting_is_not_taken_for_a_build_failure() -> None:
    refused = SettingsError("EngineSettings", ["RELAYRL_ENGINE_ATTENTION_BACKEND=triton: Triton is not installed"])
    builds = Builds(failing="flex_attention", error=refused)

    with pytest.raises(SettingsError) as err:
        runner_or_fallback(builds, cuda("auto"))

    assert err.value is refused and builds.tried == ["flex_attention"]
