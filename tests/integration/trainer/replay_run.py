"""A short trainer run to its end on the test stack (queue, paramsync, synthetic rollout), then
`relayrl replay` of it: shared by the CPU and GPU replay tests of the ``deterministic`` setting."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.trainer.trajectory_log import CONFIG_FILE, LOG_DIR
from tests.integration.trainer.harness import REPO, Stack, python_env, start_trainer, stop_group

SMALL = dict(batch_size=2, n_samples=2, max_new_tokens=4, ppo_max_token_len_per_gpu=64, dataset_size=32)
STEPS = 4


@dataclass
class Replayed:
    config: dict[str, Any]  # the run's trajectories/config.json
    report: dict[str, Any]  # the replay's JSON line
    returncode: int
    stderr: str


def train_and_replay(redis_url: str, model_dir: Path, tmp_path: Path, **settings: Any) -> Replayed:
    """Trains STEPS steps with a checkpoint every 2 and the whole log kept, then replays the run."""
    run_dir = tmp_path / "run"
    with Stack(redis_url, f"t{uuid.uuid4().hex[:6]}") as stack:
        env = stack.trainer_env(
            model_dir,
            run_dir,
            max_staleness=1,
            total_steps=STEPS,
            save_freq=2,
            keep_checkpoints=2,
            trajectory_log_keep="all",
            seed=5,
            lr=1e-3,
            **SMALL,
            **settings,
        )
        proc = start_trainer(env, tmp_path / "trainer.log")
        try:
            code = proc.wait(timeout=240)
        finally:
            stop_group(proc)
    assert code == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    cmd = [sys.executable, "-m", "commands.cli", "replay", str(run_dir), "--out", str(tmp_path / "replay")]
    done = subprocess.run(cmd, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if lines else {}
    config = json.loads((run_dir / LOG_DIR / CONFIG_FILE).read_text())
    return Replayed(config, report, done.returncode, done.stderr)
