"""Bad input on a host without a GPU: ``RELAYRL_ENGINE_DEVICE=cuda`` stops `relayrl engine serve` at
start with one line naming the setting (the trainer's and sft's: tests/unit/trainer/test_device_check.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The device check asks torch whether it sees a GPU (`make test-py312`'s venv has no torch).
pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]


def test_engine_device_cuda_without_a_gpu_stops_with_one_line_naming_the_setting(tmp_path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RELAYRL_ENGINE_DEVICE": "cuda",
        "CUDA_VISIBLE_DEVICES": "",  # no GPU for torch, on a GPU host too
    }
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", "engine", "serve", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "RELAYRL_ENGINE_DEVICE" in lines[0] and "cuda requested but torch" in lines[0]
