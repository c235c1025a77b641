"""``relayrl bench e2e``'s measurement window of a pipeline run: it opens at the trainer's first
recorded step and closes at its last, so what the trainer does after it (waiting for its last
checkpoint to be durable, ending its process) counts in neither its samples/s nor the busy shares
and token rates read beside them."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from commands.stack.bench import Window, _wait_trainer, log_tails


class Trainer:
    """The trainer as ``_wait_trainer`` watches it: its metrics.jsonl and its exit code."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.exit_code: int | None = None

    def trainer_exit_code(self) -> int | None:
        return self.exit_code

    def record(self, step: int) -> None:
        row = {"trainer/global_steps": step, "critic/score/mean": 0.5, "time": time.time()}
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")


def _until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_window_closes_at_the_last_steps_row_not_at_the_trainers_exit(tmp_path: Path) -> None:
    trainer = Trainer(tmp_path)
    window = Window(None, [], last_step=3)
    seen: dict[str, bool] = {}

    def run() -> None:
        trainer.record(1)
        seen["opened"] = _until(lambda: window.opened_at > 0)
        trainer.record(2)
        trainer.record(3)
        # The trainer has recorded its last step and is still running (its last checkpoint).
        seen["closed_before_exit"] = _until(lambda: window.closed)
        trainer.exit_code = 0

    writer = threading.Thread(target=run)
    writer.start()
    supervisor = SimpleNamespace(check_alive=lambda exited_ok: None)
    _wait_trainer(trainer, supervisor, time.monotonic() + 60, "η = 2", window)  # type: ignore[arg-type]
    writer.join()
    assert seen == {"opened": True, "closed_before_exit": True}
    assert 0 < window.elapsed < 10


def test_a_trainer_that_ends_with_its_last_row_still_closes_the_window(tmp_path: Path) -> None:
    trainer = Trainer(tmp_path)
    window = Window(None, [], last_step=2)
    trainer.record(1)
    supervisor = SimpleNamespace(check_alive=lambda exited_ok: None)

    def exit_once_opened() -> None:
        _until(lambda: window.opened_at > 0)
        trainer.record(2)
        trainer.exit_code = 0  # before the next poll sees row 2

    writer = threading.Thread(target=exit_once_opened)
    writer.start()
    _wait_trainer(trainer, supervisor, time.monotonic() + 60, "η = 0", window)  # type: ignore[arg-type]
    writer.join()
    assert window.closed


def test_a_trainer_that_fails_is_the_benchs_error(tmp_path: Path) -> None:
    trainer = Trainer(tmp_path)
    trainer.record(1)
    trainer.exit_code = 1
    supervisor = SimpleNamespace(check_alive=lambda exited_ok: None)
    with pytest.raises(RuntimeError, match="trainer exited with 1"):
        _wait_trainer(trainer, supervisor, time.monotonic() + 60, "η = 0", Window(None, [], last_step=2))  # type: ignore[arg-type]


def test_a_trainer_still_running_at_the_deadline_stops_the_wait_naming_the_phase(tmp_path: Path) -> None:
    trainer = Trainer(tmp_path)
    trainer.record(1)
    supervisor = SimpleNamespace(check_alive=lambda exited_ok: None)
    with pytest.raises(TimeoutError, match="η = 2: the trainer did not finish in time"):
        _wait_trainer(trainer, supervisor, time.monotonic() + 0.5, "η = 2", Window(None, [], last_step=3))  # type: ignore[arg-type]


def test_a_deadline_after_the_last_measured_step_keeps_the_phase(tmp_path: Path) -> None:
    # The trainer runs a step past the measured ones and then stages its last checkpoint: a deadline
    # there cuts nothing the figures count.
    trainer = Trainer(tmp_path)
    window = Window(None, [], last_step=2)
    trainer.record(1)
    trainer.record(2)
    supervisor = SimpleNamespace(check_alive=lambda exited_ok: None)

    _wait_trainer(trainer, supervisor, time.monotonic() + 1.0, "η = 2", window)  # type: ignore[arg-type]

    assert window.closed and trainer.exit_code is None


def test_a_failed_phase_prints_the_end_of_each_components_log(tmp_path: Path, capsys) -> None:
    # The work folder, and the logs the error message points to, are deleted when the command ends.
    earlier = tmp_path / "runs" / "alone" / "logs"
    earlier.mkdir(parents=True)
    (earlier / "trainer.log").write_text("an earlier phase's\n")
    logs = tmp_path / "runs" / "eta2" / "logs"
    logs.mkdir(parents=True)
    os.utime(earlier, (1, 1))  # the phase that failed is the last one started
    (logs / "trainer.log").write_text("".join(f"line {i}\n" for i in range(50)))
    (logs / "engine-0.log").write_text("CUDA out of memory\n")
    log_tails(tmp_path, lines=3)
    err = capsys.readouterr().err
    assert "the last 1 lines of eta2/logs/engine-0.log:\nCUDA out of memory" in err
    assert "the last 3 lines of eta2/logs/trainer.log:\nline 47\nline 48\nline 49" in err
    assert "an earlier phase's" not in err
