"""The triton sampling backend on a CPU: in Triton's interpreter it draws as the torch sampler does
(the same log-probs, softmax's distribution, repeatable seeds, the torch path for top-k and top-p),
and it compiles for a Hopper GPU. The checks run in processes of their own
(``triton_sampling_checks.py``): the interpreter must be on before Triton is imported, and off for
the compile. ``make setup`` installs Triton for them (``triton_runs.py``); skipped where there is
none."""

from __future__ import annotations

import pytest

from tests.unit.engine.triton_runs import run_checks, triton_version
from tests.unit.engine.triton_sampling_checks import CHECKS, COMPILED

pytestmark = pytest.mark.skipif(triton_version() is None, reason="Triton is not installed (make setup installs it)")

MODULE = "tests.unit.engine.triton_sampling_checks"


def test_the_triton_sampler_in_tritons_interpreter_draws_as_the_torch_sampler() -> None:
    assert run_checks(MODULE, interpret=True) == CHECKS


def test_the_triton_sampler_compiles_for_hopper() -> None:
    assert run_checks(MODULE, "compile", interpret=False) == COMPILED
