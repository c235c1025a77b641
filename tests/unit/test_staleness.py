import pytest

from relayrl.staleness import (
    Verdict,
    check_staleness,
    min_start_version,
    oldest_allowed_version,
    oldest_model_version,
)


def test_exactly_at_the_bound_is_fresh():
    check = check_staleness(min_policy_version=3, consumer_version=5, max_staleness=2)
    assert check.ok and check.age_versions == 2


def test_one_past_the_bound_is_stale():
    check = check_staleness(min_policy_version=2, consumer_version=5, max_staleness=2)
    assert check.verdict is Verdict.STALE and check.age_versions == 3


def test_eta_zero_accepts_only_the_current_version():
    assert check_staleness(5, 5, 0).ok
    assert check_staleness(4, 5, 0).verdict is Verdict.STALE


def test_group_from_a_newer_version_is_fresh():
    # A replica may already hold v+1 while the trainer finishes step v.
    assert check_staleness(6, 5, 0).ok


@pytest.mark.parametrize("missing", [None, -1])
def test_missing_version_is_never_fresh(missing):
    check = check_staleness(missing, consumer_version=5, max_staleness=100)
    assert check.verdict is Verdict.MISSING_VERSION and not check.ok


def test_negative_bound_is_rejected():
    with pytest.raises(ValueError, match="max_staleness"):
        oldest_allowed_version(5, -1)


def test_min_start_version_never_negative_and_matches_the_check():
    assert min_start_version(train_version=1, max_staleness=4) == 0
    floor = min_start_version(train_version=10, max_staleness=3)
    assert check_staleness(floor, 10, 3).ok
    assert not check_staleness(floor - 1, 10, 3).ok


def test_a_samples_age_is_its_oldest_model_token():
    assert oldest_model_version([3, 3, 1, 5], [1, 1, 0, 1]) == 3
    assert oldest_model_version([3, 1, 5], []) == 1  # no mask: every token is the model's
    assert oldest_model_version([], []) is None
