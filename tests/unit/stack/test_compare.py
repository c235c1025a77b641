"""`relayrl bench compare`: seeded run groups side by side, from their metrics.jsonl files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commands.stack.compare import Band, band_by_time, within_spread

VAL = "val/test_score/relayrl/long_add"
REWARD = "critic/score/mean"


def _write_run(folder: Path, seed: int, rewards: list[float], val: dict[int, float], seconds_per_step: float) -> None:
    run = folder / f"seed-{seed}"
    run.mkdir(parents=True)
    rows = [{"trainer/global_steps": 0, "time": 1000.0, VAL: val[0]}]
    for step, reward in enumerate(rewards, start=1):
        row = {"trainer/global_steps": step, "time": 1000.0 + step * seconds_per_step, REWARD: reward}
        if step in val:
            row[VAL] = val[step]
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _compare(*args: str) -> dict:
    from commands.cli import app

    done = CliRunner().invoke(app, ["bench", "compare", *args])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_groups_are_averaged_per_step_and_checked_against_the_reference_spread(tmp_path: Path) -> None:
    sync, fast, off = tmp_path / "eta0", tmp_path / "eta2", tmp_path / "broken"
    _write_run(sync, 0, [0.2, 0.4, 0.6, 0.8], {0: 0.4, 2: 0.6, 4: 0.8}, seconds_per_step=10.0)
    _write_run(sync, 1, [0.4, 0.6, 0.8, 1.0], {0: 0.4, 2: 0.8, 4: 1.0}, seconds_per_step=10.0)
    # Twice as fast in wall time, the same learning per step: inside the spread.
    _write_run(fast, 0, [0.3, 0.5, 0.7, 0.9], {0: 0.4, 2: 0.7, 4: 0.9}, seconds_per_step=5.0)
    _write_run(fast, 1, [0.3, 0.5, 0.7, 0.9], {0: 0.4, 2: 0.7, 4: 0.85}, seconds_per_step=5.0)
    # Learns nothing on held-out prompts: below the reference's spread from step 2.
    _write_run(off, 0, [0.3, 0.5, 0.7, 0.9], {0: 0.4, 2: 0.4, 4: 0.4}, seconds_per_step=5.0)
    plot = tmp_path / "cmp.png"
    printed = _compare(
        "--runs", f"eta0={sync}", "--runs", f"eta2={fast}", "--runs", f"broken={off}", "--out", str(plot)
    )

    eta0 = printed["groups"]["eta0"]
    assert eta0["seeds"] == ["seed-0", "seed-1"]
    assert eta0["by_step"][VAL] == {
        "x": [0, 2, 4],
        "mean": [0.4, 0.7, 0.9],
        "low": [0.4, 0.6, 0.8],
        "high": [0.4, 0.8, 1.0],
    }
    assert eta0["by_step"][REWARD]["mean"] == [0.3, 0.5, 0.7, 0.9]
    assert printed["groups"]["eta2"]["final"] == {REWARD: 0.9, VAL: 0.875}
    assert printed["within_spread"] == {"eta2": {VAL: True}, "broken": {VAL: False}}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and printed["plot"] == str(plot)


def test_runs_of_different_speeds_are_compared_up_to_the_shortest_run() -> None:
    band = band_by_time([((0.0, 0.0), (10.0, 1.0)), ((0.0, 0.0), (5.0, 1.0), (20.0, 1.0))])
    assert band.x[0] == 0.0 and band.x[-1] == 10.0
    # Halfway: the slow run is at 0.5, the fast one already at 1.0.
    middle = min(range(len(band.x)), key=lambda i: abs(band.x[i] - 5.0))
    assert band.low[middle] == pytest.approx(0.5, abs=0.03) and band.high[middle] == pytest.approx(1.0, abs=0.01)


def test_no_shared_step_is_no_verdict() -> None:
    reference = Band((10.0,), (0.5,), (0.4,), (0.6,))
    assert within_spread(reference, Band((20.0,), (0.5,), (0.5,), (0.5,))) is None


def test_a_group_without_runs_or_a_bad_spec_is_a_clear_error(tmp_path: Path) -> None:
    from commands.cli import app

    empty = tmp_path / "empty"
    empty.mkdir()
    done = CliRunner().invoke(app, ["bench", "compare", "--runs", f"a={empty}", "--runs", f"b={empty}"])
    assert done.exit_code == 2 and "holds no seed-*/metrics.jsonl" in _message(done.output)
    done = CliRunner().invoke(app, ["bench", "compare", "--runs", str(empty), "--runs", f"b={empty}"])
    assert done.exit_code == 2 and "is not NAME=FOLDER" in _message(done.output)


def _message(output: str) -> str:
    """Typer's error box as one line of words."""
    return " ".join(output.replace("│", " ").split())
