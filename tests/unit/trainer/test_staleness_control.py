"""max_staleness auto: the controller's rule on recorded idle and drift traces."""

from __future__ import annotations

import pytest

from services.trainer.config import TrainerSettings
from services.trainer.staleness_control import Move, StalenessController, StalenessRule, StepMeasure
from services.trainer.trainer import staleness_rule

RULE = StalenessRule(limit=4, adjust_every=3)


def trace(idle: float, starved: float | None, drift: float = 0.02, clipfrac: float = 0.01, steps: int = 3):
    return [StepMeasure(idle, starved, drift, clipfrac) for _ in range(steps)]


def run(controller: StalenessController, measures: list[StepMeasure]) -> list[tuple[Move, int]]:
    return [(d.move, d.eta) for m in measures if (d := controller.observe(m)) is not None]


def test_a_waiting_trainer_whose_rollout_has_nothing_left_to_lease_raises_eta_up_to_the_limit():
    controller = StalenessController(RULE, eta=0)
    moves = run(controller, trace(idle=0.4, starved=1.0, steps=3 * 6))
    assert moves == [
        (Move.RAISE, 1),
        (Move.RAISE, 2),
        (Move.RAISE, 3),
        (Move.RAISE, 4),
        (Move.HOLD, 4),  # never above max_staleness_limit
        (Move.HOLD, 4),
    ]


def test_eta_holds_while_the_trainer_keeps_up_or_waits_on_a_saturated_rollout():
    controller = StalenessController(RULE, eta=2)
    # Busy trainer; then a waiting one whose prompts still wait to be leased (the rollout is the limit).
    assert run(controller, trace(idle=0.01, starved=None) + trace(idle=0.5, starved=0.1)) == [
        (Move.HOLD, 2),
        (Move.HOLD, 2),
    ]


def test_drift_above_either_threshold_lowers_eta_to_zero_even_while_idle():
    controller = StalenessController(RULE, eta=3)
    drifting = trace(0.5, 1.0, drift=0.35) + trace(0.5, 1.0, clipfrac=0.3) + trace(0.5, 1.0, drift=0.25)
    assert run(controller, drifting + trace(0.5, 1.0, drift=0.3)) == [
        (Move.LOWER, 2),
        (Move.LOWER, 1),
        (Move.LOWER, 0),
        (Move.HOLD, 0),  # never below on-policy
    ]


def test_a_recorded_run_rises_holds_and_falls_as_stated():
    # A trace as a run records it: waiting on generation at first, then drift builds as η grows.
    idle = trace(0.3, 0.9, drift=0.05)
    calm = trace(0.02, 0.0, drift=0.1)
    drifting = trace(0.3, 0.9, drift=0.3, clipfrac=0.25)
    controller = StalenessController(RULE, eta=1)
    assert run(controller, idle + idle + calm + drifting + calm) == [
        (Move.RAISE, 2),
        (Move.RAISE, 3),
        (Move.HOLD, 3),
        (Move.LOWER, 2),
        (Move.HOLD, 2),
    ]


def test_a_decision_waits_for_a_whole_window_and_each_window_starts_empty():
    controller = StalenessController(RULE, eta=1)
    assert controller.observe(StepMeasure(0.9, 1.0, 0.0, 0.0)) is None
    assert controller.observe(StepMeasure(0.9, 1.0, 0.0, 0.0)) is None
    assert controller.observe(StepMeasure(0.9, 1.0, 0.0, 0.0)).eta == 2
    # The window measured under η = 1 does not count towards the next decision.
    assert controller.observe(StepMeasure(0.0, None, 0.0, 0.0)) is None
    assert controller.window == [StepMeasure(0.0, None, 0.0, 0.0)]


def test_every_threshold_is_a_setting_and_the_start_must_lie_within_the_limit():
    s = TrainerSettings(
        max_staleness="auto",
        max_staleness_limit=6,
        staleness_adjust_every=7,
        staleness_idle_threshold=0.1,
        staleness_starved_share=0.7,
        staleness_max_abs_log_ratio=0.3,
        staleness_max_clipfrac=0.15,
    )
    assert staleness_rule(s) == StalenessRule(6, 7, 0.1, 0.7, 0.3, 0.15)
    assert s.initial_staleness == 1 and TrainerSettings(max_staleness=3).initial_staleness == 3
    with pytest.raises(ValueError, match="staleness_initial"):
        TrainerSettings(max_staleness="auto", max_staleness_limit=0)
    with pytest.raises(ValueError, match="outside"):
        StalenessController(RULE, eta=5)
