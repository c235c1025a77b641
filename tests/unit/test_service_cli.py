"""Every service's start command fails the same way on a bad setting, before anything starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from commands.cli import app

CASES = [
    (["queue", "serve"], "RELAYRL_QUEUE_HTTP_PORT"),
    (["paramsync", "serve"], "RELAYRL_PARAMSYNC_HTTP_PORT"),
    (["rollout", "serve"], "RELAYRL_ROLLOUT_HTTP_PORT"),
    (["engine", "serve", "--model", "/nonexistent"], "RELAYRL_ENGINE_HTTP_PORT"),
    (["trainer", "run"], "RELAYRL_TRAINER_HTTP_PORT"),
]


@pytest.mark.parametrize(("argv", "variable"), CASES, ids=[argv[0] for argv, _ in CASES])
def test_a_bad_setting_exits_2_naming_the_variable_on_stderr(monkeypatch, argv, variable):
    monkeypatch.setenv(variable, "not-a-port")
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert variable in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def test_the_engine_without_a_model_exits_2_naming_the_variable_and_the_option(monkeypatch):
    monkeypatch.delenv("RELAYRL_ENGINE_MODEL_PATH", raising=False)
    result = CliRunner().invoke(app, ["engine", "serve"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "invalid EngineSettings: RELAYRL_ENGINE_MODEL_PATH: required (pass --model DIR)"
    assert result.stdout == ""
