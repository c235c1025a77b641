"""``relayrl up`` as a user runs it: verl's reward file and dataset paths relative to the
config, a quiet console, and a report and plot at the end."""

import json
import os
import subprocess
import sys
from pathlib import Path

from relayrl.stack.progress import REWARD_KEY

REPO = Path(__file__).resolve().parents[2]
# A constant no built-in scorer gives: the metrics show this file was the one called.
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.25\n"


def _rows(count: int) -> str:
    rows = []
    for index in range(count):
        bit = "01"[index % 2]
        rows.append(
            {
                "data_source": "flip_bit",
                "prompt": [{"role": "user", "content": f"flip {bit}"}],
                "reward_model": {"ground_truth": "1" if bit == "0" else "0"},
            }
        )
    return "".join(json.dumps(row) + "\n" for row in rows)


def test_up_trains_on_a_users_files_quietly_and_writes_a_report(tmp_path, tiny_model_dir):
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_reward.py").write_text(REWARD)
    (project / "train.jsonl").write_text(_rows(64))
    runs = tmp_path / "runs"
    (project / "stack.yaml").write_text(
        f"stack: {{run_id: mine, runs_dir: {runs}, model_dir: {tiny_model_dir}, ready_timeout_s: 120}}\n"
        "custom_reward_function: {path: my_reward.py, name: compute_score}\n"
        "trainer: {dataset: train.jsonl, n_samples: 4, batch_size: 4, max_new_tokens: 3, total_steps: 4,"
        " checkpoint_every: 2, lr: 0.003}\n"
        "rollout: {max_inflight_prompts: 8, max_new_tokens: 3}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "relayrl.cli", "up", "--config", "project/stack.yaml"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=280,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output

    run_dir = runs / "mine"
    report = json.loads((run_dir / "report.json").read_text())
    assert report["steps"] == 4
    assert (run_dir / "reward.png").stat().st_size > 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scores = [row[REWARD_KEY] for row in rows if REWARD_KEY in row]
    assert scores and all(score == 0.25 for score in scores), scores
    assert "report.json" in output and "reward " in output

    # Service logs go to runs/<id>/logs/, not the console; printed commands are never wrapped.
    assert " INFO " not in output, output
    assert (run_dir / "logs" / "trainer.log").stat().st_size > 0
    ctl_lines = [line for line in output.splitlines() if "relayrl ctl --env-file" in line]
    assert ctl_lines and ctl_lines[0].rstrip().endswith("status --all"), output
