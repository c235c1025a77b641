"""What faults cost a run: generation that was never trained on, by cause, and training redone.

Every group the queue accepted (``produced``) ends in exactly one place, so the accounting adds up:

    produced = trained + Σ dropped by cause + queued + in flight

- ``trained``: distinct groups in the lineage (the steps the final model carries, :class:`Lineage`).
- ``dropped``, by cause (docs/crash-cost.md):
  ``stale_after_rollback``: started by weights a trainer's resume discarded (the queue's and the
  trainer's ``rolled_back``); ``stale_by_bound``: older than η when the trainer reached them
  (``stale``, ``missing_version``); ``filtered``: dynamic sampling found no signal; ``duplicate``: trained
  already, delivered again after a lost acknowledgement; ``malformed`` and ``max_deliveries``.
- ``queued``: waiting in the queue at the end; ``in_flight``: delivered, not yet acknowledged.

Generation that never became an accepted group is counted in prompts, apart from the identity:
``lost_in_flight_with_dead_replica`` (leases a dead replica held: given back by its restart or
re-issued once they expired) and ``stale_before_push`` (the replica dropped its own stale group).

Seconds: ``redone_s`` is the trainer's compute in the steps it trained again after each resume
(:mod:`services.trainer.rollbacks`); ``wasted_generation_s`` estimates the rollout's share, each
wasted group costing the run's average replica-seconds per produced group.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from commands.stack.chaos.ledger import Lineage
from services.trainer.rollbacks import read_rows, redone_steps

# The queue's drop reasons (services.queue.trajectories.DROP_REASONS) and the trainer's, by cause.
CAUSES = {
    "rolled_back": "stale_after_rollback",
    "stale": "stale_by_bound",
    "missing_version": "stale_by_bound",
    "duplicate": "duplicate",
    "malformed": "malformed",
    "max_deliveries": "max_deliveries",
}
WASTED = ("stale_after_rollback", "stale_by_bound", "filtered", "malformed", "max_deliveries")


def cause_of(reason: str) -> str:
    """The cause a drop reason counts under; dynamic sampling's reasons (all_solved, ...) are ``filtered``."""
    return CAUSES.get(reason, "filtered")


@dataclass
class Waste:
    produced: int
    trained: int
    dropped: dict[str, int]  # by cause
    queued: int
    in_flight: int
    adds_up: bool  # produced = trained + Σ dropped + queued + in_flight
    wasted_share: float  # of produced groups, dropped for any cause but duplicate (a duplicate cost nothing new)
    redone_steps: int
    redone_s: float
    resumes: list[dict[str, Any]] = field(default_factory=list)  # each resume: at_step, steps, seconds
    generation_lost_prompts: dict[str, int] = field(default_factory=dict)
    wasted_generation_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def trainer_drops(groups_path: Path, trained: set[str]) -> dict[str, int]:
    """Groups the trainer skipped and never trained, by cause, from the drop lines of groups.jsonl."""
    seen: set[str] = set(trained)
    out: dict[str, int] = {}
    if not groups_path.is_file():
        return out
    for line in groups_path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "dropped" not in row:
            continue
        fresh = [g for g in row["group_ids"] if g not in seen]
        seen.update(fresh)
        if fresh:
            cause = cause_of(row["dropped"])
            out[cause] = out.get(cause, 0) + len(fresh)
    return out


def account(
    run_dir: Path,
    produced: int,
    queue_dropped_by_reason: dict[str, int],
    queued: int,
    in_flight: int,
    prompt_abandons: dict[str, int] | None = None,
    prompts_reissued: int = 0,
    replica_seconds: float | None = None,
) -> Waste:
    """The run's waste from what it leaves behind: its groups.jsonl and metrics.jsonl, and the queue's
    counters. ``replica_seconds`` (rollout replicas × the run's wall time) prices the wasted groups."""
    lineage = Lineage.read(run_dir / "groups.jsonl")
    trained = set(lineage.trained())
    dropped = trainer_drops(run_dir / "groups.jsonl", trained)
    for reason, count in queue_dropped_by_reason.items():
        if count:
            dropped[cause_of(reason)] = dropped.get(cause_of(reason), 0) + int(count)
    redone = redone_steps(read_rows(run_dir / "metrics.jsonl"))
    wasted = sum(dropped.get(c, 0) for c in WASTED)
    abandons = prompt_abandons or {}
    lost = {
        "lost_in_flight_with_dead_replica": int(abandons.get("replica_restart", 0)) + int(prompts_reissued),
        "stale_before_push": int(abandons.get("stale", 0)),
    }
    per_group_s = replica_seconds / produced if replica_seconds and produced else None
    return Waste(
        produced=produced,
        trained=len(trained),
        dropped=dict(sorted(dropped.items())),
        queued=queued,
        in_flight=in_flight,
        adds_up=produced == len(trained) + sum(dropped.values()) + queued + in_flight,
        wasted_share=round(wasted / produced, 4) if produced else 0.0,
        redone_steps=sum(r.steps for r in redone),
        redone_s=round(sum(r.seconds for r in redone), 2),
        resumes=[asdict(r) for r in redone],
        generation_lost_prompts=lost,
        wasted_generation_s=None if per_group_s is None else round(wasted * per_group_s, 1),
    )


def queue_waste(run_dir: Path, queue_address: str, replica_seconds: float | None = None) -> Waste:
    """:func:`account` with the counters of the live queue service at ``queue_address``."""
    from commands.ctl.components import queue_counters

    q, prompts = queue_counters(queue_address, timeout_s=10.0)
    return account(
        run_dir,
        q.total_produced,
        q.dropped_by_reason,
        q.queue_size,
        q.pending,
        prompts.abandoned_by_reason,
        prompts.total_reissued,
        replica_seconds,
    )
