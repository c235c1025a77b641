"""The triton sampling backend on a CPU: in Triton's interpreter it draws as the torch sampler does
(the same log-probs, softmax's distribution, repeatable seeds, the torch path for top-k and top-p),
and it compiles for a Hopper GPU. The checks run in processes of their own
(``triton_sampling_checks.py``): the interpreter must be on before Triton is imported, and off for
the compile. ``make setup`` installs Triton beside the CPU torch (which brings none); skipped
where it is not installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.engine.triton_sampling_checks import CHECKS, COMPILED

REPO = Path(__file__).parents[3]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


def _run(env: dict[str, str], *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.engine.triton_sampling_checks", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_the_triton_sampler_in_tritons_interpreter_draws_as_the_torch_sampler() -> None:
    assert _run({**os.environ, "TRITON_INTERPRET": "1"}) == CHECKS


def test_the_triton_sampler_compiles_for_hopper() -> None:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    assert _run(env, "compile") == COMPILED
