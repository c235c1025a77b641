"""The chaos run's quiet tail: what it counts as thrown away for age once the faults are over."""

from commands.stack.chaos.quiet import QuietTail, StaleCount, stale_count


def _row(step: int, trainer_stale: int) -> dict:
    return {"trainer/global_steps": step, "trainer/dropped_stale_groups": trainer_stale, "time": float(step)}


def test_every_drop_for_age_counts_wherever_it_happened():
    rows = [_row(1, 0), {"eval/score": 0.5}, _row(2, 3)]
    queue = {"stale": 2, "missing_version": 1, "rolled_back": 4, "malformed": 7, "max_deliveries": 5}
    replica = {"stale": 6, "replica_restart": 9}
    # The trainer's latest row (3), the queue's stale, missing-version and rolled-back drops (7) and
    # the replica's own stale drops (6); malformed entries and a dead replica's leases are other faults.
    assert stale_count(rows, queue, replica) == StaleCount(steps=2, stale=16)
    assert stale_count([], {}, {}) == StaleCount(steps=0, stale=0)


def test_the_tail_counts_only_what_happened_inside_it():
    before = stale_count([_row(100, 5)], {"stale": 10}, {})
    healthy = QuietTail.between(before, stale_count([_row(190, 5)], {"stale": 10}, {}), 30.04)
    assert healthy.to_json() == {"seconds": 30.0, "steps": 90, "stale_drops": 0}
    # A surplus of released prompts: a group goes stale at every step, at the queue or at the trainer.
    surplus = QuietTail.between(before, stale_count([_row(190, 50)], {"stale": 55}, {}), 30.0)
    assert (surplus.steps, surplus.stale_drops) == (90, 90)
