"""`relayrl bench learning --against`: two configs interleaved seed by seed and compared run by run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from commands.stack import learning
from commands.stack.config import StackConfig
from commands.stack.learning import SeedRun, summarize
from commands.stack.learning_pairs import mcnemar_exact, order, pair, pairs_json, render_pairs, run_pairs
from commands.stack.report import RunReport
from commands.stack.run import RunOutcome

DEMO = Path(__file__).resolve().parents[3] / "commands" / "stack" / "configs" / "demo.yaml"


def _report(last: float, wall_s: float = 100.0) -> RunReport:
    return RunReport(
        run_id="r", steps=300, wall_s=wall_s, reward_key="critic/score/mean", window=30,
        reward_first=0.005, reward_last=last, reward_rise=last - 0.005, max_staleness=1,
        max_sample_age=1.0, samples_per_s=20.0, val_first={}, val_last={}, extra={},
    )  # fmt: skip


def _run(seed: int, report: RunReport | None) -> SeedRun:
    return SeedRun(seed, Path(f"/runs/seed-{seed}"), report, ((1, 0.1),), "" if report else "trainer: died")


@pytest.mark.parametrize(
    ("only_a", "only_b", "p"),
    [
        # 2 × P(X ≤ k) for X ~ Binomial(only_a + only_b, 1/2), k the smaller count; what statsmodels'
        # mcnemar(table, exact=True) gives for these tables.
        (1, 5, 2 * (1 + 6) / 2**6),
        (0, 10, 2 / 2**10),
        (2, 8, 2 * (1 + 10 + 45) / 2**10),
        (3, 3, 1.0),
        (0, 0, 1.0),
    ],
)
def test_mcnemars_exact_test_counts_only_the_seeds_where_one_config_reached_the_threshold(
    only_a: int, only_b: int, p: float
) -> None:
    assert mcnemar_exact(only_a, only_b) == pytest.approx(p, rel=1e-12)
    assert mcnemar_exact(only_b, only_a) == pytest.approx(p, rel=1e-12)


def test_seeds_alternate_which_config_trains_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls = []

    def runner(config: StackConfig) -> RunOutcome:
        run_dir = (config.stack.runs_dir / config.stack.run_id).resolve()
        calls.append((config.trainer["lr"], config.trainer["seed"], run_dir))
        return RunOutcome(0, run_dir, _report(0.95))

    a = StackConfig.from_yaml(DEMO)
    b = a.model_copy(deep=True)
    b.trainer["lr"] = 5e-4
    runs = run_pairs({"a": a, "b": b}, [4, 5, 6], tmp_path, 10, 60, runner)
    lr_a = a.trainer["lr"]
    assert [(lr, seed) for lr, seed, _ in calls] == [(lr_a, 4), (5e-4, 4), (5e-4, 5), (lr_a, 5), (lr_a, 6), (5e-4, 6)]
    assert calls[0][2] == (tmp_path / "a" / "seed-4").resolve() and calls[1][2] == (tmp_path / "b" / "seed-4").resolve()
    assert [run.seed for run in runs["a"]] == [run.seed for run in runs["b"]] == [4, 5, 6]
    assert [order(i)[0] for i in range(3)] == ["a", "b", "a"]
    # Each run's end is told apart from the other config's on the same seed.
    assert "seed 5 (2 of 3), config B: reward 0.005 -> 0.950" in capsys.readouterr().err


def test_the_pairing_compares_each_seeds_two_runs(tmp_path: Path) -> None:
    a = [_run(0, _report(0.95, 100.0)), _run(1, _report(0.5, 100.0)), _run(2, _report(0.99)), _run(3, None)]
    b = [_run(0, _report(0.97, 110.0)), _run(1, _report(0.96, 90.0)), _run(2, _report(0.4)), _run(3, _report(0.2))]
    pairing = pair(a, b, 0.9)
    assert (pairing.both, pairing.only_a, pairing.only_b, pairing.neither) == (1, 1, 1, 1)
    assert pairing.mcnemar_p == 1.0
    # Seed 3's A run failed: it counts as not reaching the threshold and has no difference.
    assert pairing.reward_last_diff is not None and pairing.reward_last_diff.values == pytest.approx(
        (0.02, 0.46, -0.59)
    )
    assert pairing.wall_s_ratio is not None and pairing.wall_s_ratio.values == pytest.approx((1.1, 0.9, 1.0))
    assert pairing.first == ("a", "b", "a", "b")
    with pytest.raises(ValueError, match="same seeds"):
        pair(a, b[::-1], 0.9)

    printed = pairs_json(
        summarize("A", 0.9, a, tmp_path, tmp_path), summarize("B", 0.9, b, tmp_path, tmp_path), pairing
    )
    assert printed["paired"]["only_a"] == printed["paired"]["only_b"] == 1
    assert printed["a"]["reached"] == printed["b"]["reached"] == 2 and printed["a"]["failed"] == 1
    assert printed["paired"]["reward_last_diff"]["median"] == 0.02
    shown = render_pairs(
        summarize("A", 0.9, a, tmp_path, tmp_path), summarize("B", 0.9, b, tmp_path, tmp_path), pairing
    )
    assert "both 1, only A 1, only B 1, neither 1; McNemar's exact p = 1.000" in shown
    assert "reward_last B − A per seed: median +0.020" in shown


def test_the_command_runs_both_configs_on_the_same_seeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from commands.cli import app

    other = yaml.safe_load(DEMO.read_text())
    other["trainer"]["grad_clip"] = 0.3
    against = tmp_path / "clip.yaml"
    against.write_text(yaml.safe_dump(other))

    def runner(config: StackConfig) -> RunOutcome:
        run_dir = (config.stack.runs_dir / config.stack.run_id).resolve()
        run_dir.mkdir(parents=True)
        clipped = config.trainer.get("grad_clip") == 0.3
        return RunOutcome(0, run_dir, _report(0.99 if clipped else 0.5, 100.0))

    monkeypatch.setattr(learning, "stack_runner", runner)
    out = tmp_path / "runs"
    argv = ["bench", "learning", "--against", str(against), "--seeds", "3", "--first-seed", "2", "--steps", "5"]
    done = CliRunner().invoke(app, [*argv, "--json", "--out", str(out)])
    assert done.exit_code == 0, done.output
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed["seeds"] == printed["a"]["seeds"] == printed["b"]["seeds"] == [2, 3, 4]
    assert (printed["a"]["reached"], printed["b"]["reached"]) == (0, 3)
    assert printed["paired"]["only_b"] == 3 and printed["paired"]["mcnemar_p"] == 0.25
    assert printed["b"]["config"] == str(against)
    for name in ("a", "b"):
        assert Path(printed[name]["plot"]) == (out / name / "reward-by-seed.png").resolve()
        assert Path(printed[name]["plot"]).is_file()
        assert sorted(p.name for p in (out / name).glob("seed-*")) == ["seed-2", "seed-3", "seed-4"]

    # A second sweep into the same folder would resume those runs instead of training afresh.
    done = CliRunner().invoke(app, [*argv, "--out", str(out)])
    assert done.exit_code == 2 and "a/seed-2" in done.output


def test_the_command_fails_when_every_run_of_one_config_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from commands.cli import app

    def runner(config: StackConfig) -> RunOutcome:
        run_dir = (config.stack.runs_dir / config.stack.run_id).resolve()
        if config.trainer.get("grad_clip") == 0.3:
            return RunOutcome(1, run_dir, error="trainer: died")
        return RunOutcome(0, run_dir, _report(0.95))

    other = yaml.safe_load(DEMO.read_text())
    other["trainer"]["grad_clip"] = 0.3
    against = tmp_path / "clip.yaml"
    against.write_text(yaml.safe_dump(other))
    monkeypatch.setattr(learning, "stack_runner", runner)
    argv = ["bench", "learning", "--against", str(against), "--seeds", "2", "--json", "--out", str(tmp_path / "r")]
    done = CliRunner().invoke(app, argv)
    assert done.exit_code == 1
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert (printed["a"]["failed"], printed["b"]["failed"]) == (0, 2)
