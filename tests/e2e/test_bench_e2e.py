"""`relayrl bench e2e` on the realistic and agentic workloads, shortened: every phase runs and the books balance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

KEYS = {
    "engine_alone_samples_per_s",
    "trainer_alone_samples_per_s",
    "sync_samples_per_s",
    "async_samples_per_s",
    "pipeline_efficiency",
    "speedup",
    "trainer_idle_ratio",
    "rollout_idle_ratio",
    "cpu_busy_ratio",
    "weight_version_s",
    "paused_per_version_s",
    "engine_paused_per_version_s",
    "queue_share_of_step",
    "padding_ratio",
    "max_step_wait_s",
    "generated_lengths",
    "cpu_split",
    "staleness_violations",
    "lost_groups",
}


def test_a_short_realistic_bench_measures_every_phase_and_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, "-m", "commands.cli", "bench", "e2e", "--workload", "realistic", "--preset", "tiny"]
    # No --alone-steps: the workload's own default (4 for realistic) applies.
    # Every workload switches weights in place unless told otherwise: this run covers the other way.
    argv += ["--partial-rollout-mode", "abort_resume"]
    argv += ["--steps", "3", "--timeout-s", "240", "--json", "--json-out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed == json.loads(out.read_text())
    assert printed.keys() >= KEYS
    assert (printed["complete"], printed["stopped"]) == (True, None)
    assert (printed["workload"], printed["preset"], printed["dtype"]) == ("realistic", "tiny", "fp32")
    assert printed["partial_rollout_mode"] == "abort_resume"
    assert printed["staleness_violations"] == 0 and printed["lost_groups"] == 0
    for key in ("engine_alone_samples_per_s", "trainer_alone_samples_per_s", "sync_samples_per_s"):
        assert printed[key] > 0
    bottleneck = min(printed["engine_alone_samples_per_s"], printed["trainer_alone_samples_per_s"])
    assert printed["pipeline_efficiency"] == pytest.approx(printed["async_samples_per_s"] / bottleneck, rel=0.01)
    for mode in ("sync", "async"):
        assert 0.0 <= printed["trainer_idle_ratio"][mode] <= 1.0
        assert 0.0 < printed["cpu_busy_ratio"][mode] <= 1.0
        assert printed["weight_version_s"][mode] > 0
        # Read from the engine's own /metrics: every switch in the window held its scheduler a while.
        assert printed["engine_paused_per_version_s"][mode] > 0
        # The window spans the steps after the first, as the samples/s beside it do.
        assert printed["window_s"][mode] > 0
    # Lengths of the backlog generated alone (4 steps of 8 groups of 8), within the 512-token cap.
    lengths = printed["generated_lengths"]
    assert lengths["samples"] >= 4 * 8 * 8
    assert 1 <= lengths["median"] <= lengths["p90"] <= lengths["p99"] <= lengths["max"] <= 512
    # Phases are announced on stderr while they run.
    assert "trainer alone (4 steps)" in done.stderr and "async pipeline" in done.stderr


AGENTIC_KEYS = {"tool_latency_ms", "engine_idle_ratio", "env_calls", "env_s", "env_s_per_call", "episodes"}


def test_a_short_agentic_bench_runs_multi_turn_episodes_against_a_slow_environment(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "commands.cli", "bench", "e2e", "--workload", "agentic", "--tool-latency-ms", "100"]
    # Beyond η + 1 = 3 steps, so the async window holds generation too (the first 3 steps are released
    # at once): steps 4 and 5 are released after steps 1 and 2, and the window opens at step 1's row.
    # With 4 steps a bench process starved by other load opened it after the last groups were done.
    argv += ["--steps", "5", "--alone-steps", "3", "--timeout-s", "180", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed.keys() >= KEYS | AGENTIC_KEYS
    assert (printed["workload"], printed["tool_latency_ms"], printed["partial_rollout_mode"]) == (
        "agentic",
        100.0,
        "in_place",
    )
    assert printed["staleness_violations"] == 0 and printed["lost_groups"] == 0
    # Episodes of the guess game: up to three guesses, each answered by the environment.
    episodes = printed["episodes"]
    assert episodes["episodes"] >= 3 * 8 * 8 and 1 < episodes["turns_per_episode"] <= 3
    assert printed["speedup"] == pytest.approx(printed["async_samples_per_s"] / printed["sync_samples_per_s"], rel=0.01)
    for mode in ("sync", "async"):
        assert 0.0 <= printed["engine_idle_ratio"][mode] < 1.0
        # The environment's own log: calls in the window, each waiting its latency for real.
        assert printed["env_calls"][mode] > 0
        assert printed["env_s_per_call"][mode] >= 0.1


def _processes_with(text: str) -> list[int]:
    """Live processes whose environment holds ``text``."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if text.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue  # ended while we looked, or not ours to read
    return found


def test_a_bench_past_its_budget_stops_prints_what_it_has_and_leaves_nothing_running(tmp_path: Path) -> None:
    # A budget spent while the model is written: the first phase does not start its stack. The work
    # folder goes under tmp_path, so every process of the bench carries it in its environment.
    argv = [sys.executable, "-m", "commands.cli", "bench", "e2e", "--workload", "toy", "--preset", "tiny"]
    argv += ["--steps", "3", "--alone-steps", "3", "--budget-s", "1", "--json"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed["complete"] is False
    assert printed["stopped"] == (
        "engine alone, then trainer alone (3 steps): the budget (--budget-s) was spent before it started"
    )
    # No phase finished: every figure is None, and nothing was lost on the way out.
    assert printed["engine_alone_samples_per_s"] is None and printed["async_samples_per_s"] is None
    assert printed["limit"] is None and printed["trainer_idle_ratio"] == {"sync": None, "async": None}
    assert (printed["staleness_violations"], printed["lost_groups"]) == (0, 0)
    assert "Traceback" not in done.stderr and "cut short: engine alone" in done.stderr
    assert _processes_with(f"TMPDIR={tmp_path}") == []


def test_an_unknown_preset_workload_or_dtype_is_a_clear_error() -> None:
    for flag, value, choices in (
        ("--preset", "huge", "tiny, small, base"),
        ("--workload", "huge", "toy, realistic, agentic"),
        ("--dtype", "fp16", "fp32, bf16"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "commands.cli", "bench", "e2e", flag, value],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        # The message as one line, whatever the width rich wraps its error box to.
        message = " ".join(done.stderr.replace("│", " ").split())
        assert f"choose one of {choices}" in message and "Traceback" not in message


def test_a_tool_latency_for_a_single_turn_workload_is_a_clear_error() -> None:
    argv = [sys.executable, "-m", "commands.cli", "bench", "e2e", "--workload", "toy", "--tool-latency-ms", "50"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    message = " ".join(done.stderr.replace("│", " ").split())
    assert "toy workload is single-turn" in message and "Traceback" not in message
