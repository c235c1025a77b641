"""Staleness along the trainer's lineage after a rollback (relayrl.staleness.Rollback)."""

from relayrl.staleness import Rollback, Verdict, check_staleness, lineage_version


def test_versions_a_rollback_discarded_never_count_as_fresh():
    # Checkpoint at v10, killed after publishing v14: resumed as v15 with v10's weights.
    back = [Rollback(10, 15)]
    assert [lineage_version(v, back) for v in (11, 12, 14)] == [None, None, None]
    assert check_staleness(lineage_version(14, back), 15, 1).verdict is Verdict.MISSING_VERSION


def test_the_checkpoints_weights_are_as_fresh_at_the_resumed_version_as_they_were_at_it():
    back = [Rollback(10, 15)]
    assert lineage_version(10, back) == 15  # age 0 at v15: the very weights the trainer resumed with
    assert check_staleness(lineage_version(9, back), 15, 1).age_versions == 1
    assert check_staleness(lineage_version(8, back), 15, 1).verdict is Verdict.STALE
    # Versions at and after the resume are what they say.
    assert lineage_version(15, back) == 15 and lineage_version(17, back) == 17


def test_a_second_crash_before_a_new_checkpoint_widens_the_discarded_range():
    # Resumed as v15 from v10, trained to v18, killed again: the checkpoint is still v10's; resumed as v19.
    back = [Rollback(10, 15), Rollback(10, 19)]
    assert all(lineage_version(v, back) is None for v in (11, 14, 16, 18))
    assert lineage_version(10, back) == 19 and lineage_version(9, back) == 18


def test_rollbacks_from_separate_checkpoints_each_skip_their_own_range():
    back = [Rollback(10, 15), Rollback(20, 24)]
    assert lineage_version(15, back) == 19  # v15..v20 are five steps of the lineage before the second rollback
    assert lineage_version(20, back) == 24
    assert lineage_version(9, back) == 9 + 5 + 4
    assert lineage_version(22, back) is None


def test_a_resume_with_nothing_published_after_the_checkpoint_changes_nothing():
    assert [lineage_version(v, [Rollback(10, 10)]) for v in (8, 10, 11)] == [8, 10, 11]
