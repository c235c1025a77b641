"""DAPO's soft overlong punishment against hand-computed values."""

from __future__ import annotations

import pytest

from services.rollout.rewards.overlong import OverlongBuffer, apply_overlong, overlong_penalty
from services.rollout.rewards.runner import RewardOutcome

BUF = OverlongBuffer(length=4, penalty_factor=0.5)


@pytest.mark.parametrize(
    ("length", "want"),
    [(0, 0.0), (12, 0.0), (13, -0.125), (14, -0.25), (16, -0.5)],  # budget 16, ramp over the last 4 tokens
)
def test_penalty_ramps_over_the_buffer(length: int, want: float) -> None:
    assert overlong_penalty(length, 16, BUF) == pytest.approx(want, abs=1e-12)


def test_penalised_score_is_stored_with_the_raw_one() -> None:
    out = apply_overlong(RewardOutcome(1.0, {"acc": 1.0}), 15, 16, BUF)
    assert out.reward == pytest.approx(0.625)
    assert out.extra == {"acc": 1.0, "raw_score": 1.0, "overlong_reward": -0.375, "overlong": 1.0}
    short = apply_overlong(RewardOutcome(1.0), 3, 16, BUF)
    assert short.reward == 1.0 and short.extra["overlong"] == 0.0
