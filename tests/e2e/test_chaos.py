"""Seeded chaos: every kind of component is SIGKILLed while a run trains, the stack restarts it,
and the run still loses no group, trains none twice, breaks no staleness bound and never
serves an older weight version after a newer one.

The trainer is killed between two asynchronous checkpoints, so the run also proves what a crash
costs: the waste accounting adds up (produced = trained + dropped by cause + queued + in flight),
at most one checkpoint interval is redone, the groups of the discarded versions are dropped as
rolled back and the groups started at the checkpoint's own version are trained again rather than
dropped. (One run proves both: a whole stack costs CI more than either check.)"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from commands.stack.chaos.faults import FaultTracker
from commands.stack.chaos.ledger import VersionWatch, verdict
from commands.stack.chaos.waste import queue_waste
from commands.stack.launch import prepare_model
from tests.e2e.conftest import running_stack, small_run, stall_report
from tests.waiting import WaitTimeout, wait_until

SEED = 17
COMPONENTS = ("trainer", "redis", "queue", "paramsync", "engine-0", "rollout-0")
# Each kill waits for the component before it to be back, which takes seconds (a process start,
# readiness, the next weight version): room for six of those even when steps take well under one,
# after the trainer's kill waited for its place between two checkpoints.
TOTAL_STEPS = 36
SAVE_FREQ = 4
ETA = 1


def _between_checkpoints(step: int) -> bool:
    """Two or three steps after a checkpoint (durable by then), before the next one starts."""
    return step > SAVE_FREQ and step % SAVE_FREQ >= 2


# The suite's 300 s per test, plus room for the two runs this one replaced: on a loaded machine a
# restarted trainer took close to a minute to train again, and the run's own waits below should be
# the ones that fail, with their report of where the run stood.
@pytest.mark.timeout(420)
def test_killing_each_kind_of_component_keeps_the_four_zeros_and_the_waste_adds_up(runs_dir, tiny_model_dir):
    config = small_run(runs_dir, tiny_model_dir, max_staleness=ETA, total_steps=TOTAL_STEPS, save_freq=SAVE_FREQ)
    config.stack.run_id = "chaos"
    # Acknowledged means on disk: with `everysec` a Redis crash may forget the last second.
    config.stack.redis_appendfsync = "always"
    config.stack.restart_backoff_s = 0.2
    rng = random.Random(SEED)
    order = list(COMPONENTS)
    rng.shuffle(order)
    # The trainer starts once the chaos loop watches: the kills are keyed to its steps from the first.
    with running_stack(config, training=False) as stack:
        tracker, watch = FaultTracker(stack), VersionWatch()
        engines = {f"engine-{i}": url for i, url in enumerate(stack.endpoints.engines)}
        next_at_step = rng.randint(1, 2)
        stack.start_training(prepare_model(stack))

        def run_done() -> bool:
            """One round of the chaos: watch versions, and kill the next component once the last one is back."""
            nonlocal next_at_step
            if stack.trainer_exit_code() is not None:
                return True
            tracker.tick()
            watch.poll({n: (url, _pid(stack, n)) for n, url in engines.items()})
            due = order and not tracker.open_faults() and tracker.step >= next_at_step
            if due and (order[0] != "trainer" or _between_checkpoints(tracker.step)):
                tracker.sigkill(order.pop(0))
                next_at_step = tracker.step + rng.randint(1, 2)
            return False

        try:
            wait_until(run_done, 240, "the run to finish", poll_s=0.2)
        except WaitTimeout as exc:
            raise AssertionError(f"run not done; open faults {tracker.open_faults()}\n{stall_report(stack)}") from exc
        assert not order, f"the run ended before {order} were killed"
        assert stack.trainer_exit_code() == 0

        def all_back() -> bool:
            tracker.tick()
            return not tracker.open_faults()

        # The run may end while the last component killed is still starting: it must come back all the same.
        try:
            wait_until(all_back, 60, "every killed component to be back", poll_s=0.2)
        except WaitTimeout as exc:
            raise AssertionError(f"still down: {tracker.open_faults()}") from exc
        result = verdict(stack.run_dir, stack.endpoints.queue_grpc, ETA, watch)
        waste = queue_waste(stack.run_dir, stack.endpoints.queue_grpc)
        lines = _groups_lines(stack.run_dir / "groups.jsonl")
        ctl = subprocess.run(
            [sys.executable, "-m", "commands.cli", "ctl", "--env-file", str(stack.ctl_env_file), "status", "--all"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    assert {f.component for f in tracker.faults} == set(COMPONENTS)
    assert (result.lost_groups, result.trained_twice, result.staleness_violations, result.version_regressions) == (
        0, 0, 0, 0,
    ), result  # fmt: skip
    assert result.steps == TOTAL_STEPS and result.trained_groups == TOTAL_STEPS * 4
    assert result.stalls_over_30s == 0, result
    restarts = stack.supervisor.restarts
    assert all(restarts[name].restarts == 1 for name in COMPONENTS), {n: r.restarts for n, r in restarts.items()}
    assert "Restarts" in ctl.stdout and "rollout-0" in ctl.stdout, ctl.stdout + ctl.stderr

    # What the trainer's crash cost.
    assert waste.adds_up, waste
    assert waste.produced == waste.trained + sum(waste.dropped.values()) + waste.queued + waste.in_flight
    assert 1 <= waste.redone_steps <= SAVE_FREQ, waste
    assert waste.dropped.get("stale_after_rollback", 0) > 0, waste  # trained in the lost steps, on lost weights
    # The first step after the checkpoint trained, before and after the kill, on groups started at the
    # checkpoint's version or one before: the resumed trainer took them again.
    (resume,) = waste.resumes
    first, again = (set(row["group_ids"]) for row in lines if row.get("step") == resume["at_step"])
    assert first & again, (first, again)


def _groups_lines(path: Path) -> list[dict[str, Any]]:
    """The lines of a groups.jsonl, but one a kill tore."""
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return lines


def _pid(stack, name: str) -> int | None:
    component = stack.supervisor.get(name)
    return component.process.pid if component.running() else None
