"""The triton attention backend on a CPU, in Triton's interpreter: its kernel equals dense SDPA
(float32, tight tolerance) for decode steps, over pages out of order, with Qwen2.5-0.5B's head
groups and rows longer than a tile, and the model runner over it gives every row the logits of a
lone forward pass. The checks run in a process of their own (``triton_checks.py``): the
interpreter must be on before Triton is imported, and on in no other process (an engine started
by another test inherits the environment). Skipped where Triton 3.8 or later is not installed
(an older interpreter cannot run a loop bounded by a loaded value under NumPy 2.4)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.engine.triton_checks import CHECKS

REPO = Path(__file__).parents[3]


def _triton_version() -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in importlib.metadata.version("triton").split(".")[:2])
    except importlib.metadata.PackageNotFoundError:
        return None


def test_the_triton_backend_in_tritons_interpreter_equals_dense_attention_and_lone_passes() -> None:
    version = _triton_version()
    if version is None or version < (3, 8):
        pytest.skip(f"Triton 3.8 or later is not installed (found {version})")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.engine.triton_checks"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == CHECKS
