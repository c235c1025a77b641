"""Every service's start command fails the same way on a bad setting, before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commands.cli import app

REPO = Path(__file__).resolve().parents[2]

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


def test_a_setting_under_its_former_name_works_and_logs_one_line_naming_the_new_one(tmp_path):
    code = (
        "from relayrl.service_cli import settings_or_exit; from services.trainer.config import TrainerSettings;"
        " print(settings_or_exit(TrainerSettings).save_freq)"
    )
    env = {name: value for name, value in os.environ.items() if not name.startswith("RELAYRL_")}
    env.update(PYTHONPATH=str(REPO), RELAYRL_TRAINER_CHECKPOINT_EVERY="4")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4"
    (line,) = done.stderr.splitlines()
    assert line.endswith(
        "RELAYRL_TRAINER_CHECKPOINT_EVERY is deprecated: it is the former name of RELAYRL_TRAINER_SAVE_FREQ"
        " (save_freq), which it sets; rename it"
    )
    assert "WARNING" in line
