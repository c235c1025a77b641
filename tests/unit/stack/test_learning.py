"""`relayrl bench learning` without processes: seeding, the spread over runs, failed runs, the plot."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commands.stack import learning
from commands.stack.config import StackConfig, StackSettings
from commands.stack.launch import LocalStack
from commands.stack.learning import (
    SeedRun,
    plot_seeds,
    render_table,
    result_json,
    run_seeds,
    seeded_config,
    summarize,
    wilson_interval,
)
from commands.stack.report import RunReport
from commands.stack.run import RunOutcome
from commands.stack.supervisor import Supervisor

VAL = "val/test_score/relayrl/long_add"
DEMO = Path(__file__).resolve().parents[3] / "commands" / "stack" / "configs" / "demo.yaml"


def _report(
    first: float,
    last: float,
    steps: int = 200,
    wall_s: float = 150.0,
    val: tuple[float, float] | None = None,
    failed_whole: float | None = None,
) -> RunReport:
    """``failed_whole``: the run ended with every group alike within itself, this share of them failed."""
    held_out = {} if val is None else {"first": {VAL: val[0]}, "last": {VAL: val[1]}}
    return RunReport(
        run_id="r", steps=steps, wall_s=wall_s, reward_key="critic/score/mean", window=30,
        reward_first=first, reward_last=last, reward_rise=last - first, max_staleness=1,
        max_sample_age=1.0, samples_per_s=20.0, val_first=held_out.get("first", {}),
        val_last=held_out.get("last", {}), extra={},
        no_signal_last=None if failed_whole is None else 1.0, all_failed_last=failed_whole,
    )  # fmt: skip


def _run(seed: int, report: RunReport | None, error: str = "") -> SeedRun:
    return SeedRun(seed, Path(f"/runs/seed-{seed}"), report, ((1, 0.1), (2, 0.5)), error)


def test_the_spread_covers_finished_runs_and_failed_ones_do_not_reach_the_threshold(tmp_path: Path) -> None:
    runs = [
        _run(0, _report(0.1, 0.95, wall_s=100.0)),
        _run(1, _report(0.2, 0.5, wall_s=200.0, failed_whole=0.5)),
        _run(2, None, "engine-0: exited with code 1"),
        _run(3, _report(0.0, 0.9, steps=180, wall_s=120.0)),
    ]
    result = summarize("demo", 0.9, runs, tmp_path / "p.png", tmp_path)
    assert result.reached == 2 and result.failed == 1
    assert result.reward_last is not None and result.reward_last.values == (0.95, 0.5, 0.9)
    assert (result.reward_last.min, result.reward_last.median, result.reward_last.max) == (0.5, 0.9, 0.95)
    assert result.reward_last.mean == pytest.approx(0.7833, abs=1e-4)
    assert result.reward_first is not None and result.reward_first.median == pytest.approx(0.1)
    assert result.steps is not None and (result.steps.min, result.steps.max) == (180.0, 200.0)
    assert result.wall_s is not None and result.wall_s.median == 120.0
    printed = result_json(result)
    assert printed["seeds"] == [0, 1, 2, 3]
    assert [r["reached"] for r in printed["runs"]] == [True, False, False, True]
    # Seed 1 ended with every group alike, half of them failed: one answer to every prompt.
    assert [r["stalled"] for r in printed["runs"]] == [False, True, None, False] and printed["stalled"] == 1
    assert printed["runs"][2]["error"] == "engine-0: exited with code 1" and printed["runs"][2]["reward_last"] is None
    json.dumps(printed)
    # The failed run counts as one that did not reach the threshold: 2 of 4.
    assert printed["reached_interval"] == {
        "share": 0.5, "low": 0.15, "high": 0.85, "confidence": 0.95, "method": "wilson"
    }  # fmt: skip
    table = " ".join(render_table(result).split())
    assert "failed: engine-0: exited with code 1" in table
    assert table.count("no (stalled)") == 1
    assert "0.9: 2 of 4 runs (1 failed, 1 stalled); share 0.50, 95% interval 0.15-0.85 (Wilson)" in table


@pytest.mark.parametrize(
    ("hits", "n", "low", "high"),
    # Wilson's 95 % interval as statsmodels' proportion_confint(hits, n, method="wilson") gives it.
    [(8, 10, 0.4902, 0.9433), (10, 10, 0.7225, 1.0), (0, 10, 0.0, 0.2775), (26, 30, 0.7032, 0.9469)],
)
def test_the_share_that_reached_the_threshold_comes_with_wilsons_interval(
    hits: int, n: int, low: float, high: float
) -> None:
    interval = wilson_interval(hits, n)
    assert interval.share == hits / n
    assert (interval.low, interval.high) == (pytest.approx(low, abs=1e-4), pytest.approx(high, abs=1e-4))


def test_held_out_scores_are_spread_over_the_runs_that_validated(tmp_path: Path) -> None:
    runs = [
        _run(0, _report(0.2, 0.5, val=(0.375, 0.969))),
        _run(1, _report(0.2, 0.4, val=(0.3, 0.8))),
        _run(2, _report(0.1, 0.3)),
    ]
    result = summarize("long_add", 0.9, runs, tmp_path / "p.png", tmp_path)
    assert result.val_first[VAL].values == (0.375, 0.3) and result.val_last[VAL].median == pytest.approx(0.8845)
    printed = result_json(result)
    assert printed["val_last"][VAL]["max"] == 0.969 and printed["runs"][0]["val_first"] == {VAL: 0.375}
    assert printed["runs"][2]["val_last"] == {}


def test_steps_to_a_held_out_threshold_count_the_first_validation_at_or_above_it(tmp_path: Path) -> None:
    def validated(seed: int, points: tuple[tuple[int, float], ...], report: RunReport | None) -> SeedRun:
        # Each validation 3 s of wall time per step after the first (seed 1 twice as fast).
        by_time = {VAL: tuple((step * 3.0 / (1 + (seed == 1)), score) for step, score in points)}
        error = "" if report else "late"
        return SeedRun(seed, tmp_path, report, ((1, 0.1),), error, val_curve={VAL: points}, val_by_time=by_time)

    runs = [
        # Dips below again after reaching it: the first step counts.
        validated(0, ((0, 0.375), (10, 0.6), (20, 0.91), (30, 0.85), (40, 0.95)), _report(0.2, 0.5)),
        validated(1, ((0, 0.375), (10, 0.9), (20, 0.97)), _report(0.2, 0.5)),
        validated(2, ((0, 0.375), (10, 0.5), (20, 0.89)), _report(0.2, 0.5)),
        # A failed run is no evidence either way.
        validated(3, ((0, 0.375), (10, 0.95)), None),
    ]
    result = summarize("long_add", 0.9, runs, tmp_path / "p.png", tmp_path, val_threshold=0.9)
    assert result.val_reached == {VAL: 2}
    assert result.val_steps_to_threshold[VAL].values == (20.0, 10.0)
    printed = result_json(result)
    assert printed["val_threshold"] == 0.9 and printed["val_steps_to_threshold"][VAL]["median"] == 15.0
    assert [run["val_steps_to_threshold"] for run in printed["runs"]] == [{VAL: 20}, {VAL: 10}, {VAL: None}, None]
    # And the wall time it took: what a GPU run is compared with a CPU run by.
    assert result.val_seconds_to_threshold[VAL].values == (60.0, 15.0)
    assert printed["val_seconds_to_threshold"][VAL]["median"] == 37.5
    assert [run["val_seconds_to_threshold"] for run in printed["runs"]] == [{VAL: 60.0}, {VAL: 15.0}, {VAL: None}, None]
    assert printed["runs"][1]["val_curve"] == {VAL: [[0, 0.375], [10, 0.9], [20, 0.97]]}
    table = " ".join(render_table(result).split())
    assert f"{VAL} ≥ 0.9: 2 of 3 finished runs; steps to it: median 15" in table
    assert "seconds to it: median 37.5" in table
    # Without a threshold nothing about it is reported.
    plain = result_json(summarize("long_add", 0.9, runs, tmp_path / "p.png", tmp_path))
    assert plain["val_steps_to_threshold"] == {} and plain["runs"][0]["val_steps_to_threshold"] is None
    assert plain["val_seconds_to_threshold"] == {} and plain["runs"][0]["val_seconds_to_threshold"] is None


def test_no_finished_run_gives_no_spread(tmp_path: Path) -> None:
    result = summarize("demo", 0.9, [_run(0, None, "TimeoutError: late")], tmp_path / "p.png", tmp_path)
    assert result.reward_last is None and result.wall_s is None
    assert (result.reached, result.failed) == (0, 1)
    assert result_json(result)["reward_last"] is None


def test_a_seed_changes_every_seed_and_nothing_else(tmp_path: Path) -> None:
    base = StackConfig.from_yaml(DEMO)
    config = seeded_config(base, 7, tmp_path, steps=None)
    assert (config.stack.tiny_seed, config.trainer["seed"], config.engine["seed"]) == (7, 7, 7)
    assert (config.stack.runs_dir, config.stack.run_id) == (tmp_path, "seed-7")
    seed_fields = {"stack": {"tiny_seed", "run_id", "runs_dir"}, "trainer": {"seed"}, "engine": {"seed"}}
    before, after = base.model_dump(), config.model_dump()
    for section, values in after.items():
        changed = {key for key, value in (values or {}).items() if (before[section] or {}).get(key) != value}
        assert changed == seed_fields.get(section, set()), section
    # The base config is left as it was for the next seed.
    assert "seed" not in base.engine and base.stack.tiny_seed == 0


def test_steps_replaces_total_steps_only_when_given(tmp_path: Path) -> None:
    base = StackConfig.from_yaml(DEMO)
    assert seeded_config(base, 0, tmp_path, steps=4).trainer["total_steps"] == 4
    assert seeded_config(base, 0, tmp_path, steps=None).trainer["total_steps"] == base.trainer["total_steps"]


def test_the_engine_samples_with_the_configured_seed_per_replica(tmp_path: Path) -> None:
    config = StackConfig(stack=StackSettings(rollout_replicas=2, runs_dir=tmp_path), engine={"seed": 5})
    specs = LocalStack(config, Supervisor(None))._engine_specs(tmp_path / "model")
    assert [spec.env["RELAYRL_ENGINE_SEED"] for spec in specs] == ["5", "6"]


def test_one_line_per_seed_is_plotted(tmp_path: Path) -> None:
    runs = [_run(0, _report(0.1, 0.9)), _run(1, None, "late"), SeedRun(2, tmp_path, None, (), "no steps")]
    plotted = plot_seeds(runs, 0.9, tmp_path / "seeds.png", "t")
    # The run that recorded no step has no curve to draw; the failed one with steps is drawn.
    assert plotted.seeds == (0, 1)
    assert plotted.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _finishing_runner(calls: list[int]):
    """A runner standing in for run_stack: seed 0 finishes, 1 fails, 2 never ends, 3 finishes."""

    def runner(config: StackConfig) -> RunOutcome:
        seed = config.trainer["seed"]
        calls.append(seed)
        run_dir = (config.stack.runs_dir / config.stack.run_id).resolve()
        run_dir.mkdir(parents=True)
        rows = [{"trainer/global_steps": s, "critic/score/mean": 0.2 * s, "time": float(s)} for s in (1, 2)]
        rows[1][VAL] = 0.5
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if seed == 1:
            return RunOutcome(1, run_dir, error="engine-0: exited with code 1")
        if seed == 2:
            threading.Event().wait(30)
        return RunOutcome(0, run_dir, _report(0.2, 0.95))

    return runner


def test_a_failed_or_late_run_is_recorded_and_the_next_seed_still_runs(tmp_path: Path) -> None:
    calls: list[int] = []
    runs = run_seeds(StackConfig.from_yaml(DEMO), [0, 1, 2, 3], tmp_path, 4, 0.5, _finishing_runner(calls))
    assert calls == [0, 1, 2, 3]
    assert [run.report is not None for run in runs] == [True, False, False, True]
    assert runs[1].error == "engine-0: exited with code 1"
    assert runs[2].error == "RunTimedOut: the run did not finish within 0.5s"
    assert runs[0].curve == ((1, 0.2), (2, 0.4)) and runs[2].curve == ((1, 0.2), (2, 0.4))
    assert runs[0].val_curve == {VAL: ((2, 0.5),)} and runs[1].val_curve == {VAL: ((2, 0.5),)}
    # Step 2's validation came 1 s after the first row.
    assert runs[0].val_by_time == {VAL: ((1.0, 0.5),)} and runs[2].val_by_time == {VAL: ((1.0, 0.5),)}
    assert runs[0].run_dir == (tmp_path / "seed-0").resolve()


def test_a_run_past_its_deadline_stops_though_its_code_catches_every_exception(tmp_path: Path) -> None:
    # The stack's polls catch httpx's errors, and a TimeoutError raised in a socket call becomes one.
    def polling(config: StackConfig) -> RunOutcome:
        run_dir = (config.stack.runs_dir / config.stack.run_id).resolve()
        until = time.monotonic() + 5
        while time.monotonic() < until:
            # What a poll of /metrics does with a failed request.
            with contextlib.suppress(Exception):
                time.sleep(0.01)
        return RunOutcome(0, run_dir, _report(0.2, 0.95))

    started = time.monotonic()
    [run] = run_seeds(StackConfig.from_yaml(DEMO), [0], tmp_path, 1, 0.3, polling)

    assert run.report is None and run.error == "RunTimedOut: the run did not finish within 0.3s"
    assert time.monotonic() - started < 4


def test_an_interrupted_run_stops_the_bench(tmp_path: Path) -> None:
    def interrupted(config: StackConfig) -> RunOutcome:
        return RunOutcome(130, tmp_path)

    with pytest.raises(KeyboardInterrupt):
        run_seeds(StackConfig.from_yaml(DEMO), [0, 1], tmp_path, 4, 60, interrupted)


def test_the_command_fails_only_when_every_run_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from commands.cli import app

    outcomes = {0: 0, 1: 1}

    def runner(config: StackConfig) -> RunOutcome:
        code = outcomes[config.trainer["seed"]]
        return RunOutcome(code, tmp_path, _report(0.1, 0.95) if code == 0 else None, error="trainer: died")

    monkeypatch.setattr(learning, "stack_runner", runner)
    argv = ["bench", "learning", "--config", str(DEMO), "--seeds", "2", "--json"]
    done = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "some")])
    assert done.exit_code == 0, done.output
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert (printed["reached"], printed["failed"], printed["seeds"]) == (1, 1, [0, 1])
    assert Path(printed["plot"]).is_file()

    outcomes[0] = 1
    done = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "none")])
    assert done.exit_code == 1
    assert json.loads(done.stdout.strip().splitlines()[-1])["failed"] == 2


def test_an_out_folder_holding_a_seed_is_refused(tmp_path: Path) -> None:
    from commands.cli import app

    (tmp_path / "seed-1").mkdir()
    done = CliRunner().invoke(app, ["bench", "learning", "--seeds", "2", "--out", str(tmp_path)])
    assert done.exit_code == 2
    assert "seed-1" in done.output and "choose another folder" in " ".join(done.output.replace("│", " ").split())


def test_every_seed_starts_from_the_given_model_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from commands.cli import app

    model_dir = tmp_path / "sft"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    started_from = []

    def runner(config: StackConfig) -> RunOutcome:
        started_from.append(config.stack.model_dir)
        return RunOutcome(0, tmp_path, _report(0.1, 0.95))

    monkeypatch.setattr(learning, "stack_runner", runner)
    argv = ["bench", "learning", "--config", str(DEMO), "--seeds", "2", "--json", "--out", str(tmp_path / "runs")]
    done = CliRunner().invoke(app, [*argv, "--model-dir", str(model_dir)])
    assert done.exit_code == 0, done.output
    assert started_from == [model_dir.resolve()] * 2
    done = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "other"), "--model-dir", str(tmp_path)])
    assert done.exit_code == 2 and "is not a model directory (no config.json)" in " ".join(
        done.output.replace("│", " ").split()
    )


def test_max_staleness_overrides_the_configs_for_every_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from commands.cli import app

    staleness = []

    def runner(config: StackConfig) -> RunOutcome:
        staleness.append(config.stack.max_staleness)
        return RunOutcome(0, tmp_path, _report(0.1, 0.95))

    monkeypatch.setattr(learning, "stack_runner", runner)
    argv = ["bench", "learning", "--config", str(DEMO), "--seeds", "2", "--json"]
    assert CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "a"), "--max-staleness", "0"]).exit_code == 0
    assert CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "b")]).exit_code == 0
    default = StackConfig.from_yaml(DEMO).stack.max_staleness
    assert default != 0 and staleness == [0, 0, default, default]


def test_the_engines_serve_in_place_what_the_replicas_receive_into_memory(tmp_path: Path) -> None:
    config = StackConfig(stack=StackSettings(runs_dir=tmp_path), rollout={"weights_shm_dir": "/dev/shm/x"})
    (spec,) = LocalStack(config, Supervisor(None))._engine_specs(tmp_path / "model")
    assert spec.env["RELAYRL_ENGINE_SHARED_WEIGHTS_DIR"] == "/dev/shm/x"
    config = StackConfig(stack=StackSettings(runs_dir=tmp_path), engine={"shared_weights_dir": ""})
    (spec,) = LocalStack(config, Supervisor(None))._engine_specs(tmp_path / "model")
    assert spec.env["RELAYRL_ENGINE_SHARED_WEIGHTS_DIR"] == "", "the engine section's own value wins"
