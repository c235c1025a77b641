"""Bad input: ``device: cuda`` where torch sees no GPU stops `relayrl trainer run` and `relayrl sft` at
start with one line naming the setting, before any process group, model or server exists."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("command", "variable"),
    [(["trainer", "run"], "RELAYRL_TRAINER_DEVICE"), (["sft", "--data", "builtin:copy"], "RELAYRL_SFT_DEVICE")],
)
def test_cuda_without_a_gpu_stops_at_start_with_one_line(tiny_model_dir, tmp_path, command, variable):
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        variable: "cuda",
        "CUDA_VISIBLE_DEVICES": "",  # no GPU for torch, on a GPU host too
        "RELAYRL_TRAINER_MODEL_DIR": str(tiny_model_dir),
        "RELAYRL_SFT_MODEL_DIR": str(tiny_model_dir),
        "RELAYRL_SFT_OUT_DIR": str(tmp_path / "out"),
        "RELAYRL_TRAINER_RUN_DIR": str(tmp_path / "run"),
        # A process group would need these; it must never get that far.
        "MASTER_ADDR": "192.0.2.1",
        "MASTER_PORT": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", *command], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert variable in lines[0] and "cuda" in lines[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()
