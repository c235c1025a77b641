"""bench staleness: how each mode is configured, and the figures and targets read from its runs."""

from __future__ import annotations

import pytest

from commands.stack.bench_staleness import mode_settings, staleness_figures, targets
from services.trainer.config import TrainerSettings


def test_auto_runs_every_other_service_at_the_limit_and_the_trainer_alone_on_auto():
    assert mode_settings("2", limit=4, adjust_every=5) == (2, {})
    eta, overrides = mode_settings("auto", limit=3, adjust_every=2)
    assert eta == 3
    trainer = TrainerSettings(**overrides)
    assert (trainer.max_staleness, trainer.max_staleness_limit, trainer.staleness_adjust_every) == ("auto", 3, 2)


def test_figures_are_read_from_the_training_steps_only():
    rows = [
        {"step": 0, "trainer/global_steps": 0, "val/test_score/x": 0.1},  # validation before training
        {"trainer/global_steps": 1, "staleness/avg_sample_age": 0.0, "staleness/max_sample_age": 0, "staleness/eta": 1,
         "training/rollout_logprob_abs_diff_mean": 0.01},
        {"trainer/global_steps": 2, "staleness/avg_sample_age": 1.0, "staleness/max_sample_age": 2, "staleness/eta": 2,
         "training/rollout_logprob_abs_diff_mean": 0.03},
    ]  # fmt: skip
    assert staleness_figures(rows) == pytest.approx(
        {"mean_sample_age": 0.5, "max_sample_age": 2, "mean_abs_log_ratio": 0.02, "eta_mean": 1.5, "eta_last": 2}
    )


def test_auto_is_compared_with_the_best_fixed_eta_and_the_smallest_one_nearly_as_fast():
    modes = {
        "0": {"samples_per_s": 5.0, "mean_sample_age": 0.0},
        "1": {"samples_per_s": 9.7, "mean_sample_age": 0.9},
        "2": {"samples_per_s": 10.0, "mean_sample_age": 1.4},
        "auto": {"samples_per_s": 9.6, "mean_sample_age": 1.0},
    }
    assert targets(modes) == {
        "auto_vs_best_fixed": 0.96,
        "smallest_fixed_at_auto_speed": 1,
        "auto_mean_age_vs_that_fixed": pytest.approx(0.1),
    }
    assert targets({"0": modes["0"]}) == {}
