"""DAPO's soft overlong punishment (verl ``reward_model.overlong_buffer``), applied to scores.

With a response budget L and a buffer of B tokens, a response of length ℓ is punished by
min(0, −(ℓ − (L − B)) / B · factor): nothing up to L − B tokens, then linearly down to −factor
at the budget. The raw score is kept in ``reward_extra`` next to the penalty so dashboards and
the trainer can tell them apart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from services.rollout.rewards.runner import RewardOutcome


@dataclass(frozen=True, slots=True)
class OverlongBuffer:
    length: int
    penalty_factor: float


def overlong_penalty(response_length: int, max_response_length: int, buffer: OverlongBuffer) -> float:
    expected = max_response_length - buffer.length
    exceed = response_length - expected
    return min(-exceed / buffer.length * buffer.penalty_factor, 0.0)


def apply_overlong(
    outcome: RewardOutcome, response_length: int, max_response_length: int, buffer: OverlongBuffer
) -> RewardOutcome:
    penalty = overlong_penalty(response_length, max_response_length, buffer)
    extra = outcome.extra | {"raw_score": outcome.reward, "overlong_reward": penalty, "overlong": float(penalty < 0)}
    return replace(outcome, reward=outcome.reward + penalty, extra=extra)
