"""``max_staleness: auto``: the trainer picks η itself, from what each step measured.

Pure logic over recorded measurements (one :class:`StepMeasure` per training step), so the rule
is tested on traces. Every ``staleness_adjust_every`` steps the controller looks at the steps
since its last decision and does exactly one of:

1. **lower** η by one when off-policy drift grew: the window's mean ``|log π_prox − log π_behav|``
   (``training/rollout_logprob_abs_diff_mean``) is above ``staleness_max_abs_log_ratio``, or its
   mean clipped share (``actor/pg_clipfrac``) is above ``staleness_max_clipfrac``. Drift wins over
   idle: stale data that hurts learning is not worth the throughput.
2. **raise** η by one when the trainer waits for batches (its mean ``trainer/idle_ratio`` above
   ``staleness_idle_threshold``) *and* the rollout could take more work than was admitted: in at
   least ``staleness_starved_share`` of the steps that waited, the prompt queue had nothing left
   to lease (every admitted prompt already taken). A trainer that waits on a saturated rollout
   (prompts still waiting to be leased) gains nothing from a larger η, only older samples.
3. **hold** otherwise, and always at the bounds (never below 0, never above ``max_staleness_limit``).

After a change the window starts empty: steps measured under the old η say little about the new.
Each change carries its reason, which the trainer logs; η itself is ``staleness/eta``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import StrEnum


class Move(StrEnum):
    RAISE = "raise"
    LOWER = "lower"
    HOLD = "hold"


@dataclass(frozen=True, slots=True)
class StalenessRule:
    """The thresholds of the rule (the trainer's ``staleness_*`` settings)."""

    limit: int = 4
    adjust_every: int = 5
    idle_threshold: float = 0.05
    starved_share: float = 0.5
    max_abs_log_ratio: float = 0.2
    max_clipfrac: float = 0.2


@dataclass(frozen=True, slots=True)
class StepMeasure:
    """What one training step measured."""

    idle_ratio: float  # trainer/idle_ratio: the share of the step spent waiting for the batch
    # Share of the step's wait rounds in which the prompt queue had nothing left to lease (None: it did not wait).
    admission_starved: float | None
    abs_log_ratio: float  # training/rollout_logprob_abs_diff_mean
    clipfrac: float  # actor/pg_clipfrac


@dataclass(frozen=True, slots=True)
class Decision:
    move: Move
    eta: int  # η after the decision
    reason: str


@dataclass
class StalenessController:
    rule: StalenessRule
    eta: int
    window: list[StepMeasure] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 <= self.eta <= self.rule.limit:
            raise ValueError(f"initial η {self.eta} is outside [0, max_staleness_limit={self.rule.limit}]")

    def observe(self, measure: StepMeasure) -> Decision | None:
        """Adds one step; every ``adjust_every`` steps returns the decision (η already applied)."""
        self.window.append(measure)
        if len(self.window) < self.rule.adjust_every:
            return None
        decision = decide(self.rule, self.eta, self.window)
        self.window.clear()
        self.eta = decision.eta
        return decision


def decide(rule: StalenessRule, eta: int, window: list[StepMeasure]) -> Decision:
    """The rule of the module docstring over one window of steps."""
    drift = statistics.fmean(m.abs_log_ratio for m in window)
    clipped = statistics.fmean(m.clipfrac for m in window)
    idle = statistics.fmean(m.idle_ratio for m in window)
    waited = [m.admission_starved for m in window if m.admission_starved is not None]
    starved = statistics.fmean(waited) if waited else 0.0
    if drift > rule.max_abs_log_ratio or clipped > rule.max_clipfrac:
        why = (
            f"drift: mean |log ratio| {drift:.3f} (max {rule.max_abs_log_ratio}),"
            f" clipped {clipped:.3f} (max {rule.max_clipfrac})"
        )
        if eta == 0:
            return Decision(Move.HOLD, 0, f"{why}; already on-policy")
        return Decision(Move.LOWER, eta - 1, why)
    if idle > rule.idle_threshold and starved >= rule.starved_share:
        why = f"idle {idle:.3f} (threshold {rule.idle_threshold}) with nothing left to lease in {starved:.2f} of waits"
        if eta >= rule.limit:
            return Decision(Move.HOLD, eta, f"{why}; at max_staleness_limit {rule.limit}")
        return Decision(Move.RAISE, eta + 1, why)
    if idle > rule.idle_threshold:
        return Decision(Move.HOLD, eta, f"idle {idle:.3f}, but prompts were left to lease ({starved:.2f} starved)")
    return Decision(Move.HOLD, eta, f"idle {idle:.3f}, drift {drift:.3f}, clipped {clipped:.3f}: within bounds")
