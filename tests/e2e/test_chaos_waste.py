"""A seeded short chaos run whose trainer is SIGKILLed between two asynchronous checkpoints: the
waste accounting adds up (produced = trained + dropped by cause + queued + in flight), at most one
checkpoint interval is redone, the groups of the discarded versions are dropped as rolled back and
the groups started at the checkpoint's own version are trained again rather than dropped."""

from __future__ import annotations

import json
import random

from commands.stack.chaos.faults import FaultTracker
from commands.stack.chaos.ledger import VersionWatch, verdict
from commands.stack.chaos.waste import queue_waste
from commands.stack.launch import prepare_model
from tests.e2e.conftest import running_stack, small_run, stall_report
from tests.waiting import WaitTimeout, wait_until

SEED = 52
TOTAL_STEPS = 14
SAVE_FREQ = 4
ETA = 1


def test_a_trainer_killed_between_async_checkpoints_costs_at_most_one_interval_and_adds_up(runs_dir, tiny_model_dir):
    # checkpoint_every: the harness's own setting under its former name, which wins over save_freq.
    config = small_run(runs_dir, tiny_model_dir, max_staleness=ETA, total_steps=TOTAL_STEPS, checkpoint_every=SAVE_FREQ)
    config.stack.run_id = "waste"
    config.stack.redis_appendfsync = "always"
    config.stack.restart_backoff_s = 0.2
    # Two steps after the checkpoint of step 4 (durable by then), before the one of step 8 starts.
    kill_at = random.Random(SEED).randint(SAVE_FREQ + 2, 2 * SAVE_FREQ - 1)
    with running_stack(config, training=False) as stack:
        tracker, watch = FaultTracker(stack), VersionWatch()
        stack.start_training(prepare_model(stack))

        def run_done() -> bool:
            if stack.trainer_exit_code() is not None:
                return True
            tracker.tick()
            if not tracker.faults and tracker.step >= kill_at:
                tracker.sigkill("trainer")
            return False

        try:
            wait_until(run_done, 240, "the run to finish", poll_s=0.2)
        except WaitTimeout as exc:
            raise AssertionError(f"run not done; faults {tracker.faults}\n{stall_report(stack)}") from exc
        assert stack.trainer_exit_code() == 0 and len(tracker.faults) == 1
        result = verdict(stack.run_dir, stack.endpoints.queue_grpc, ETA, watch)
        waste = queue_waste(stack.run_dir, stack.endpoints.queue_grpc)
        lines = [json.loads(line) for line in (stack.run_dir / "groups.jsonl").read_text().splitlines()]

    assert (result.lost_groups, result.trained_twice, result.staleness_violations) == (0, 0, 0), result
    assert result.steps == TOTAL_STEPS and result.trained_groups == TOTAL_STEPS * 4
    assert waste.adds_up, waste
    assert waste.produced == waste.trained + sum(waste.dropped.values()) + waste.queued + waste.in_flight
    assert 1 <= waste.redone_steps <= SAVE_FREQ, waste
    assert waste.dropped.get("stale_after_rollback", 0) > 0, waste  # trained in the lost steps, on lost weights
    # The first step after the checkpoint trained, before and after the kill, on groups started at the
    # checkpoint's version or one before: the resumed trainer took them again.
    first, again = (set(row["group_ids"]) for row in lines if row.get("step") == SAVE_FREQ + 1)
    assert first & again, (first, again)
