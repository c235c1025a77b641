"""How ``relayrl bench e2e`` sets up each phase's stack. Under ``--budget-s`` a phase starts only with
the time it needs left (on a GPU a stack starts its engine and compiles its trainer for about two
minutes), and a stack's start never waits past the budget, so the run always has time to stop it and
print what it measured. The trainer runs one step past the measured ones (its last step stages the
run's last checkpoint before recording its row). On a GPU the engine batches every sequence in
flight, as ``bench engine`` runs it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from commands.stack.bench import CUDA_READY_TIMEOUT_S, DEFAULT_READY_TIMEOUT_S, MIN_PHASE_S, TAIL_STEPS, BenchRun
from commands.stack.workloads import get_workload


def run_with(device: str, budget_left_s: float | None) -> BenchRun:
    deadline = None if budget_left_s is None else time.monotonic() + budget_left_s
    here = Path(".")
    return BenchRun(here, here, here, get_workload("realistic"), 0, 300.0, device=device, deadline=deadline)  # type: ignore[arg-type]


def test_a_phase_needs_its_minimum_left_of_the_budget_to_start() -> None:
    with pytest.raises(TimeoutError, match=r"of the budget \(--budget-s\) left, too little to start a phase"):
        run_with("cuda", MIN_PHASE_S["cuda"] - 10).phase_deadline()

    # The same time left starts a phase on a CPU, and it ends at the budget.
    before = time.monotonic()
    deadline = run_with("cpu", MIN_PHASE_S["cuda"] - 10).phase_deadline()
    assert before + MIN_PHASE_S["cuda"] - 11 < deadline <= time.monotonic() + MIN_PHASE_S["cuda"] - 10


def test_a_stacks_start_waits_no_longer_than_the_budget_leaves() -> None:
    assert run_with("cuda", None).ready_timeout_s() == CUDA_READY_TIMEOUT_S
    assert run_with("cpu", None).ready_timeout_s() == DEFAULT_READY_TIMEOUT_S
    assert 190 < run_with("cuda", 200).ready_timeout_s() <= 200
    assert run_with("cuda", 10_000).ready_timeout_s() == CUDA_READY_TIMEOUT_S


def test_the_trainer_runs_a_step_past_the_measured_ones_and_a_gpu_engine_batches_every_sequence() -> None:
    cuda, cpu = run_with("cuda", None).config("eta2", 2, 4), run_with("cpu", None).config("eta2", 2, 4)

    assert cuda.trainer["total_steps"] == cpu.trainer["total_steps"] == 4 + TAIL_STEPS
    assert cuda.engine["max_running_requests"] == 256 and cuda.engine["max_prefill_tokens"] == 16384
    # On a CPU the engine keeps its own defaults, which the CPU figures were measured with.
    assert "max_running_requests" not in cpu.engine and "max_prefill_tokens" not in cpu.engine
