"""The chaos run's waste accounting: every accepted group in exactly one place, drops by cause,
steps redone after each resume."""

import json

from commands.stack.chaos.waste import account


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _step(step, ids, version=None):
    return {"step": step, "version": step if version is None else version, "group_ids": ids, "ages": [0] * len(ids)}


def test_the_accounting_adds_up_and_names_each_cause(tmp_path):
    # Steps 1-3 trained; killed, resumed from the checkpoint of step 2: step 3 trained again on "e", "g".
    _write(
        tmp_path / "groups.jsonl",
        [
            _step(1, ["a", "b"]),
            _step(2, ["c", "d"]),
            _step(3, ["e", "f"]),
            {"dropped": "stale", "group_ids": ["h"]},
            {"dropped": "all_solved", "group_ids": ["i"]},
            _step(3, ["e", "g"], version=4),
        ],
    )
    _write(
        tmp_path / "metrics.jsonl",
        [{"trainer/global_steps": s, "timing/step_s": 2.0, "timing/wait_s": 0.5} for s in (1, 2, 3, 3)],
    )
    # 15 accepted: 6 trained, "h" and "i" skipped by the trainer, "f" (trained in the discarded step
    # 3) and two more dropped by the queue as rolled back, one as stale, two queued, one in flight.
    waste = account(tmp_path, 15, {"rolled_back": 3, "stale": 1, "malformed": 0}, 2, 1, {"replica_restart": 2}, 1, 30.0)
    assert waste.trained == 6
    assert waste.dropped == {"filtered": 1, "stale_after_rollback": 3, "stale_by_bound": 2}
    assert waste.adds_up
    assert waste.wasted_share == round(6 / 15, 4)
    assert (waste.redone_steps, waste.redone_s) == (1, 1.5)
    assert waste.generation_lost_prompts == {"lost_in_flight_with_dead_replica": 3, "stale_before_push": 0}
    assert waste.wasted_generation_s == 12.0  # 6 wasted groups at 2 replica-seconds each

    # One group more accepted than found anywhere: the accounting does not add up.
    assert not account(tmp_path, 16, {"rolled_back": 3, "stale": 1}, 2, 1).adds_up
