"""What ``relayrl up --resume`` finds and says: every place tried, the checkpoint it resumes from,
and a finished run left as it is."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commands.stack.resume import ResumeError, find_run, finished_step, resume_line, stop_line

REPO = Path(__file__).resolve().parents[3]


def _run_dir(root: Path, checkpoint_step: int | None, total_steps: int, report_steps: int | None = None) -> Path:
    """A run directory as `relayrl up` leaves it: its saved config, checkpoints and report."""
    run_dir = root / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(f"stack: {{run_id: r1}}\ntrainer: {{total_steps: {total_steps}}}\n")
    if checkpoint_step is not None:
        step_dir = run_dir / "checkpoints" / f"step_{checkpoint_step:08d}"
        step_dir.mkdir(parents=True)
        (step_dir / "trainer_state.json").write_text(json.dumps({"step": checkpoint_step, "version": 3}))
        (run_dir / "checkpoints" / "latest").write_text(step_dir.name)
    if report_steps is not None:
        (run_dir / "report.json").write_text(json.dumps({"steps": report_steps, "wall_s": 12.5}))
    return run_dir


def test_an_unknown_run_names_every_place_tried(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ResumeError) as err:
        find_run("nope")
    assert "nope/config.yaml" in str(err.value) and "runs/nope/config.yaml" in str(err.value)


def test_a_run_is_found_by_its_id_and_the_checkpoint_is_named(tmp_path, monkeypatch):
    run_dir = _run_dir(tmp_path, 4, total_steps=8)
    monkeypatch.chdir(tmp_path)
    assert find_run("r1") == Path("runs/r1")
    checkpoint = run_dir / "checkpoints" / "step_00000004"
    assert resume_line(run_dir) == f"resuming from step 4 (checkpoint {checkpoint})"
    assert stop_line(run_dir, "r1").startswith(f"checkpoint at step 4: {checkpoint}; continue with")
    assert finished_step(run_dir, 8) is None


def test_a_run_without_a_checkpoint_says_it_starts_over(tmp_path):
    run_dir = _run_dir(tmp_path, None, total_steps=8)
    assert "training starts from step 0" in resume_line(run_dir)
    assert stop_line(run_dir, "r1").startswith("no checkpoint written")


def test_resuming_a_finished_run_says_so_and_leaves_its_report_unchanged(tmp_path):
    run_dir = _run_dir(tmp_path, 6, total_steps=8, report_steps=8)
    before = (run_dir / "report.json").read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", "up", "--resume", "r1"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "r1 already finished (8 of 8 steps); nothing to resume" in done.stdout
    assert (run_dir / "report.json").read_bytes() == before
    assert not (run_dir / "logs").exists(), "nothing started"


def test_resume_of_an_unknown_run_is_one_error_naming_both_places(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", "up", "--resume", "nope"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "nope/config.yaml" in done.stderr and "runs/nope/config.yaml" in done.stderr
    assert "Traceback" not in done.stderr
