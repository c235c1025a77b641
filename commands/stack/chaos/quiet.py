"""The quiet tail: once the last fault has recovered, does the run stop throwing generation away?

A fault may cost groups while it lasts and shortly after (started by weights a resume discarded, or
aged past η while a component was down). Once every component is back and what the fault left
behind has drained, a healthy run drops nothing more: the chaos run of docs/reliability.md dropped
no group as stale in 900 s. A surplus of released prompts never drains by itself: the trainer makes
up for every drop by releasing another prompt, so the surplus goes stale again at every step for
the rest of the run (a lost release answer and an over-counted resume both did that once). Its
signature is drops that go on long after the last fault, which only a stretch without faults shows.

The tail's first half lets the faults' leftovers drain; its second half counts every group thrown
away for age (the queue's and the trainer's stale, missing-version and rolled-back drops, and the
groups a replica dropped itself before pushing). A run passes with none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from services.queue.trajectories import AGE_DROP_REASONS

# A replica's own drop reason for age (a lease given back as stale).
REPLICA_STALE_REASON = "stale"
TRAINER_STALE_KEY = "trainer/dropped_stale_groups"
STEP_KEY = "trainer/global_steps"


@dataclass(frozen=True)
class StaleCount:
    """The run's training steps and the groups it has thrown away for age, so far."""

    steps: int
    stale: int


def stale_count(
    metrics_rows: Iterable[Mapping[str, Any]],
    queue_dropped_by_reason: Mapping[str, int],
    replica_abandoned_by_reason: Mapping[str, int],
) -> StaleCount:
    """From the trainer's metrics rows so far (its counters are cumulative; the latest row holds
    them) and the queue's counters of trajectories dropped and prompts abandoned by reason."""
    latest: Mapping[str, Any] = {}
    for row in metrics_rows:
        if STEP_KEY in row:
            latest = row
    queue = sum(int(queue_dropped_by_reason.get(r, 0)) for r in AGE_DROP_REASONS)
    replica = int(replica_abandoned_by_reason.get(REPLICA_STALE_REASON, 0))
    return StaleCount(int(latest.get(STEP_KEY, 0)), queue + replica + int(latest.get(TRAINER_STALE_KEY, 0)))


@dataclass(frozen=True)
class QuietTail:
    seconds: float  # of the counted half
    steps: int  # trained in it
    stale_drops: int  # groups thrown away for age in it

    @classmethod
    def between(cls, before: StaleCount, after: StaleCount, seconds: float) -> QuietTail:
        return cls(round(seconds, 1), after.steps - before.steps, after.stale - before.stale)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
