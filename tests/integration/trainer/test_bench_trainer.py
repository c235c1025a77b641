"""`relayrl bench trainer` runs end to end on the tiny model (a proof that it works, not a figure):
one JSON line with verl's perf names, the long-tailed realistic workload, the switches it was given
echoed back, and with --profile where a step's time went; past its deadline it measures no further
step."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace

from services.trainer.bench import BenchConfig, _measure, write_model
from tests.integration.trainer.harness import REPO, python_env


def test_the_trainer_bench_prints_verl_perf_metrics_for_the_realistic_workload():
    cmd = [sys.executable, "-m", "commands.cli", "bench", "trainer", "--json", "--steps", "1", "--world-size", "1"]
    cmd += ["--workload", "realistic", "--response-len", "48", "--enable-gradient-checkpointing", "--profile"]
    done = subprocess.run(cmd, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["workload"] == "realistic" and result["enable_gradient_checkpointing"] is True
    assert result["use_remove_padding"] is True and result["padding_ratio"] == 0.0
    assert result["perf/throughput"] > 0 and result["timing_s/update_weights"] > 0
    assert result["fsdp_over_single"] > 0 and result["single_process_tokens_per_s"] > 0
    # No peak FLOP/s or allocator on a CPU: those figures are left out, not made up.
    assert result["perf/mfu/actor"] is None and result["perf/max_memory_allocated_gb"] is None
    # On CPU nothing compiles (sdpa, eager log-prob statistics): the JSON says so rather than guessing.
    assert result["compile"] == {"graphs": 0, "seconds": 0.0, "kernels_s": 0.0}
    # --profile: one more step says where its time went, by kind and by operator, busiest first.
    profile = result["profile"]
    assert profile["device"] == "cpu" and profile["by_kind"]["matmul"] > 0 and profile["by_kind"]["attention"] > 0
    seconds = [entry["s"] for entry in profile["top"]]
    assert seconds == sorted(seconds, reverse=True) and seconds[0] > 0


def test_past_its_deadline_a_bench_run_measures_one_step_after_its_warm_up(tmp_path):
    """``--timeout-s``: a budgeted GPU session keeps the figures of the steps that fit."""
    cfg = BenchConfig(steps=2, world_size=1, batch_groups=2, n_samples=2)
    model_dir = write_model(cfg, tmp_path / "model")
    assert _measure(cfg, model_dir, fsdp=False)["steps"] == 2
    late = replace(cfg, deadline_unix=time.time() - 1.0)
    assert _measure(late, model_dir, fsdp=False)["steps"] == 1
