"""What ``relayrl up --resume`` resumes, and what a stopped run leaves to resume, in words.

- The run is found as given (a directory) or under ``runs/``; when neither holds a run, the
  error names every place tried.
- ``--resume`` says "resuming from step N (checkpoint …)" before anything starts; a run whose
  trainer already reached ``total_steps`` is reported as finished and nothing is started or
  rewritten (its ``report.json`` stays as it was).
- A run stopped by Ctrl-C or a failure names the checkpoint it can resume from (the trainer
  writes one when it stops on a publish boundary).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from commands.stack.export import RUN_CONFIG

RUNS_DIR = Path("runs")


class ResumeError(ValueError):
    """The run to resume cannot be found or read."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    step: int
    path: Path


def find_run(resume: str) -> Path:
    """The run directory ``resume`` names: itself, else ``runs/<resume>``."""
    tried = [Path(resume), RUNS_DIR / resume]
    for run_dir in tried:
        if (run_dir / RUN_CONFIG).is_file():
            return run_dir
    places = " nor ".join(str(p / RUN_CONFIG) for p in dict.fromkeys(tried))
    raise ResumeError(f"no run {resume!r}: neither {places} exists (give runs/<id> or the run's id)")


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The checkpoint ``checkpoints/latest`` names (the trainer resumes from it); None when there is none."""
    marker = run_dir / "checkpoints" / "latest"
    if not marker.is_file():
        return None
    path = marker.parent / marker.read_text().strip()
    state = path / "trainer_state.json"
    if not state.is_file():
        return None
    return Checkpoint(int(json.loads(state.read_text()).get("step", 0)), path)


def finished_step(run_dir: Path, total_steps: int) -> int | None:
    """The step at which the run's trainer finished (reached ``total_steps``); None when it did not."""
    checkpoint = latest_checkpoint(run_dir)
    steps = [checkpoint.step] if checkpoint else []
    report = run_dir / "report.json"
    if report.is_file():
        # An unreadable report says nothing about the run.
        with contextlib.suppress(ValueError, AttributeError):
            steps.append(int(json.loads(report.read_text()).get("steps", 0)))
    done = max(steps, default=0)
    return done if done >= total_steps else None


def resume_line(run_dir: Path) -> str:
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return f"resuming {run_dir.name}: no checkpoint in {run_dir / 'checkpoints'}; training starts from step 0"
    return f"resuming from step {checkpoint.step} (checkpoint {checkpoint.path})"


def stop_line(run_dir: Path, run_id: str) -> str:
    """What a stopped run can resume from."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return f"no checkpoint written; `relayrl up --resume {run_id}` would start from step 0"
    return f"checkpoint at step {checkpoint.step}: {checkpoint.path}; continue with `relayrl up --resume {run_id}`"
