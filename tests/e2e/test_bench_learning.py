"""`relayrl bench learning` on the demo config, shortened to two seeds of four steps of a small batch."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import yaml

from tests.e2e.conftest import log_tails

DEMO = Path(__file__).resolve().parents[2] / "commands" / "stack" / "configs" / "demo.yaml"


def _demo_with_a_small_batch(tmp_path: Path) -> Path:
    """The demo config with 4 prompts of 4 samples per step instead of 16 of 8: what this test checks is
    the bench around the runs (seeds, run directories, the summary and plot), not what the demo learns."""
    config = yaml.safe_load(DEMO.read_text())
    config["trainer"].update(batch_size=4, n_samples=4)
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_two_seeds_of_the_demo_run_apart_and_are_summarised_in_one_json_line(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    config = _demo_with_a_small_batch(tmp_path)
    argv = [sys.executable, "-m", "commands.cli", "bench", "learning", "--config", str(config)]
    argv += ["--seeds", "2", "--first-seed", "3", "--steps", "4", "--timeout-s", "240", "--out", str(out), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed["seeds"] == [3, 4]
    assert printed["failed"] == 0, _why_runs_failed(printed["runs"])
    assert [run["seed"] for run in printed["runs"]] == [3, 4]
    for run in printed["runs"]:
        assert run["error"] is None and run["steps"] == 4
        assert math.isfinite(run["reward_first"]) and math.isfinite(run["reward_last"])
        # Each run has its own directory, started with its own seed everywhere.
        saved = yaml.safe_load((Path(run["run_dir"]) / "config.yaml").read_text())
        assert Path(run["run_dir"]) == (out / f"seed-{run['seed']}").resolve()
        assert saved["trainer"]["seed"] == saved["engine"]["seed"] == saved["stack"]["tiny_seed"] == run["seed"]
    assert printed["steps"]["min"] == printed["steps"]["max"] == 4
    assert Path(printed["plot"]).stat().st_size > 0
    assert "seed 4 (2 of 2)" in done.stderr


def _why_runs_failed(runs: list[dict]) -> str:
    """Each failed run's error and the last lines of its services' logs: a failure on a CI machine
    leaves nothing else to read."""
    out = []
    for run in runs:
        if run["error"] is None:
            continue
        out.append(f"seed {run['seed']}: {run['error']}")
        out.extend(log_tails(Path(run["run_dir"]), 15))
    return "\n".join(out)
