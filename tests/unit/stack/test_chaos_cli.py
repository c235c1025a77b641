import pytest
import typer

from commands.stack.chaos.cli import parse_duration
from commands.stack.chaos.run import RunResult, fault_free_figures, passed


def test_durations_read_as_users_write_them():
    assert parse_duration("15m") == 900 and parse_duration("90s") == 90 and parse_duration("1h") == 3600
    assert parse_duration("45") == 45
    for bad in ("", "0m", "15 minutes", "-5s"):
        with pytest.raises(typer.BadParameter, match="expected a duration"):
            parse_duration(bad)


def test_a_bad_quiet_tail_is_refused_naming_its_option():
    from typer.testing import CliRunner

    from commands.cli import app

    result = CliRunner().invoke(app, ["chaos", "--quiet-tail", "soon"])
    assert result.exit_code == 2 and "--quiet-tail" in result.output and "expected a duration" in result.output


def test_a_run_passes_only_with_every_zero_and_every_fault_recovered():
    zeros = dict(
        lost_groups=0,
        trained_twice=0,
        staleness_violations=0,
        version_regressions=0,
        stalls_over_30s=0,
        stale_after_recovery=0,
    )
    assert passed({**zeros, "unrecovered": 0})
    assert not passed({**zeros, "unrecovered": 1})
    for key in zeros:
        assert not passed({**zeros, key: 1, "unrecovered": 0})


def test_the_chaos_reward_is_judged_against_the_spread_of_the_fault_free_runs():
    healthy = [RunResult(800, r, 600.0, seed) for seed, r in enumerate((0.97, 0.99, 0.95))]
    inside = fault_free_figures(0.96, healthy)
    assert inside["fault_free"]["reward_end"] == {"min": 0.95, "max": 0.99, "mean": 0.97}
    assert [run["seed"] for run in inside["fault_free"]["runs"]] == [0, 1, 2]
    assert (inside["reward_within_spread"], inside["reward_vs_spread"]) == (True, "within")
    below, above = fault_free_figures(0.94, healthy), fault_free_figures(0.995, healthy)
    assert (below["reward_within_spread"], below["reward_vs_spread"]) == (False, "below")
    assert (above["reward_within_spread"], above["reward_vs_spread"]) == (False, "above")
    unknown = fault_free_figures(None, healthy)
    assert unknown["reward_within_spread"] is None and unknown["reward_vs_spread"] is None


def test_the_chaos_run_and_its_fault_free_runs_train_at_a_constant_rate(tmp_path):
    from commands.stack.chaos.run import chaos_config
    from commands.stack.check import load_checked

    path = tmp_path / "cosine.yaml"
    path.write_text("trainer:\n  lr_scheduler_type: cosine\n  min_lr_ratio: 0.1\n  total_steps: 300\n")
    base = load_checked(path)
    chaos, fault_free = chaos_config(base, "c", 0, 1_000_000), chaos_config(base, "f", 0, 412)
    assert chaos.trainer["lr_scheduler_type"] == fault_free.trainer["lr_scheduler_type"] == "constant"
    assert (chaos.trainer["total_steps"], fault_free.trainer["total_steps"]) == (1_000_000, 412)
