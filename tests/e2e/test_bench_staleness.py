"""`relayrl bench staleness`, shortened: a fixed η and auto run on one workload, and every figure is there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIGURES = {
    "samples_per_s",
    "trainer_idle_ratio",
    "mean_sample_age",
    "max_sample_age",
    "mean_abs_log_ratio",
    "eta_mean",
    "eta_last",
    "staleness_violations",
    "lost_groups",
    "steps",
}


def test_a_short_bench_runs_a_fixed_eta_and_auto_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, "-m", "commands.cli", "bench", "staleness", "--workload", "toy", "--preset", "tiny"]
    argv += ["--steps", "3", "--modes", "0,auto", "--adjust-every", "1", "--limit", "2"]
    argv += ["--timeout-s", "300", "--json", "--json-out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed == json.loads(out.read_text())
    assert (printed["benchmark"], printed["workload"], printed["limit"]) == ("staleness", "toy", 2)
    assert list(printed["modes"]) == ["0", "auto"]
    for mode, figures in printed["modes"].items():
        assert figures.keys() == FIGURES, mode
        assert figures["samples_per_s"] > 0 and figures["steps"] == 3
        assert figures["staleness_violations"] == 0 and figures["lost_groups"] == 0
    assert printed["modes"]["0"]["max_sample_age"] == 0 and printed["modes"]["0"]["eta_last"] == 0
    # auto decided after every step, within [0, limit], and no sample was older than the limit.
    assert 0 <= printed["modes"]["auto"]["eta_last"] <= 2 and printed["modes"]["auto"]["max_sample_age"] <= 2
    assert printed["smallest_fixed_at_auto_speed"] == 0
    assert printed["auto_vs_best_fixed"] > 0
