"""``relayrl check`` as a user runs it: a shipped recipe passes from any working directory and as a
copy elsewhere (what it names of the package is named ``builtin:``), and a setting under its former
name passes with one warning line naming the setting that replaced it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from commands.stack.check import load_checked
from relayrl.tasks.interaction_configs import INTERACTION_CONFIGS, interaction_config_file

REPO = Path(__file__).resolve().parents[3]
AGENTIC = REPO / "commands" / "stack" / "configs" / "agentic.yaml"


def _check(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "commands.cli", "check", "--config", str(config)],
        capture_output=True, text=True, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60,
    )  # fmt: skip


def test_the_agentic_recipe_checks_from_another_folder_and_as_a_copy(tmp_path):
    done = _check(AGENTIC, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{AGENTIC}: ok"
    copy = tmp_path / "mine" / "agentic.yaml"
    copy.parent.mkdir()
    shutil.copy(AGENTIC, copy)
    done = _check(copy, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_agentic_recipe_names_the_interaction_config_the_package_ships():
    config = load_checked(AGENTIC)
    assert config.rollout["multi_turn_interaction_config_path"] == "builtin:guess"
    shipped = interaction_config_file("builtin:guess")
    assert shipped.is_file() and shipped.parent == REPO / "relayrl" / "tasks"
    # An installed package holds only what pyproject's package-data lists besides the modules.
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for name in INTERACTION_CONFIGS.values():
        assert any(fnmatch(name, pattern) for pattern in package_data.get("relayrl.tasks", [])), name


def test_an_unknown_builtin_interaction_config_is_named(tmp_path):
    path = tmp_path / "stack.yaml"
    path.write_text("rollout:\n  multi_turn_enable: true\n  multi_turn_interaction_config_path: builtin:gess\n")
    done = _check(path, cwd=tmp_path)
    assert done.returncode == 2
    assert (
        "rollout.multi_turn_interaction_config_path: 'builtin:gess' is not a built-in interaction config;"
        " there is builtin:guess"
    ) in done.stderr


@pytest.mark.parametrize(
    ("former", "current"), [("checkpoint_every", "save_freq"), ("micro_batch_tokens", "ppo_max_token_len_per_gpu")]
)
def test_a_former_name_passes_with_one_line_naming_the_new_setting(tmp_path, former, current):
    path = tmp_path / "stack.yaml"
    path.write_text(f"trainer:\n  sync_every: 2\n  {former}: 64\n")
    done = _check(path, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"trainer.{former}: deprecated, the former name of trainer.{current}, which it sets; rename it"
    ]
    path.write_text(f"trainer:\n  sync_every: 2\n  {current}: 64\n")
    done = _check(path, cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
