"""The chaos run's accounting: lineage across trainer restarts, lost and twice-trained groups,
staleness violations and version regressions."""

import json

from commands.stack.chaos.ledger import Lineage, VersionWatch, lost_groups, step_gaps


def _lineage(tmp_path, *rows) -> Lineage:
    """The lineage of a groups.jsonl holding ``rows`` and, as after a crash, a torn last line."""
    path = tmp_path / "groups.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "torn')
    return Lineage.read(path)


def test_steps_written_again_after_a_resume_replace_the_rolled_back_ones(tmp_path):
    lineage = _lineage(
        tmp_path,
        {"step": 1, "version": 0, "group_ids": ["a", "b"], "ages": [0, 0]},
        {"step": 2, "version": 1, "group_ids": ["c", "d"], "ages": [1, 0]},
        {"step": 3, "version": 2, "group_ids": ["e", "f"], "ages": [0, 1]},  # lost with the crash
        {"dropped": "stale", "group_ids": ["g"]},
        # resumed from the checkpoint at step 2: step 3 again, "e" trained again legitimately
        {"step": 3, "version": 2, "group_ids": ["e", "h"], "ages": [0, 2]},
    )
    assert lineage.trained() == ["a", "b", "c", "d", "e", "h"]
    assert lineage.trained_twice() == 0
    assert lineage.staleness_violations(max_staleness=1) == 1  # "h" at age 2
    # 9 accepted: 6 trained, 1 skipped by the trainer, 1 dropped by the queue, "f" still queued.
    assert lost_groups(lineage, produced=9, queue_dropped=1, queued=1, pending=0) == 0
    assert lost_groups(lineage, produced=10, queue_dropped=1, queued=1, pending=0) == 1


def test_steps_after_the_checkpoint_that_a_resumed_run_never_reached_again_are_rolled_back(tmp_path):
    # A trainer killed at step 3 resumed from the checkpoint at step 1, and the run ended after
    # its step 2: the killed run's step 3 is not in the final model. Its groups were never
    # acknowledged, and the queue dropped them as stale when it delivered them again.
    lineage = _lineage(
        tmp_path,
        {"step": 1, "version": 0, "group_ids": ["a", "b"], "ages": [0, 0]},
        {"step": 2, "version": 1, "group_ids": ["c", "d"], "ages": [0, 0]},
        {"step": 3, "version": 2, "group_ids": ["e", "f"], "ages": [0, 0]},
        {"step": 2, "version": 3, "group_ids": ["c", "g"], "ages": [0, 0]},
    )
    assert lineage.trained() == ["a", "b", "c", "g"]
    # 8 accepted: 4 trained, "d", "e" and "f" dropped by the queue, "h" still queued.
    assert lost_groups(lineage, produced=8, queue_dropped=3, queued=1, pending=0) == 0


def test_a_group_in_two_steps_of_the_lineage_is_trained_twice(tmp_path):
    lineage = _lineage(
        tmp_path,
        {"step": 1, "version": 0, "group_ids": ["a", "b"], "ages": [0, 0]},
        {"step": 2, "version": 1, "group_ids": ["b", "c"], "ages": [1, 0]},
    )
    assert lineage.trained_twice() == 1


def test_an_engine_going_back_a_version_is_a_regression_a_restarted_one_a_reset():
    watch = VersionWatch()
    for pid, version in ((10, 1), (10, 3), (10, 2), (11, 0), (11, 4)):
        watch.observe("engine-0", pid, version)
    assert watch.regressions == ["engine-0 went from v3 to v2"]
    assert watch.resets == 1


def test_step_gaps_come_from_the_training_rows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(json.dumps({"time": t, "trainer/global_steps": i}) + "\n" for i, t in enumerate((10.0, 12.5, 50.0)))
    )
    assert step_gaps(path) == [2.5, 37.5]
    assert step_gaps(path, until=90.0) == [2.5, 37.5, 40.0]  # no step since: a stall to the end


def test_a_group_is_held_to_the_eta_it_was_admitted_under(tmp_path):
    # max_staleness auto: η rose to 2 and fell back to 0; each group carries the η of its admission.
    lineage = _lineage(
        tmp_path,
        {"step": 1, "version": 4, "group_ids": ["a", "b"], "ages": [2, 0], "etas": [2, 0]},
        {"step": 2, "version": 5, "group_ids": ["c", "d"], "ages": [1, 2], "etas": [0, None]},
    )
    # "c" is one version older than its η = 0 allowed; "d" carried none and is held to the run's bound.
    assert lineage.staleness_violations(max_staleness=1) == 2
    assert lineage.staleness_violations(max_staleness=2) == 1
