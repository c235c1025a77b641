import pytest

from services.queue.lengths import LengthSummary, LengthWindow, long_share


def test_the_longest_tenth_of_answers_and_their_share_of_tokens():
    # Ten answers: the longest one (100 tokens) is the longest 10 %, holding 100 of 190 tokens.
    assert long_share([10] * 9 + [100]) == LengthSummary(100.0, pytest.approx(100 / 190))
    # Eleven answers: the longest 10 % rounds up to two.
    summary = long_share([10] * 9 + [50, 100])
    assert summary.long_threshold_tokens == 50.0 and summary.long_token_share == pytest.approx(150 / 240)


def test_ties_at_the_threshold_count_as_long_and_nothing_pushed_is_zero():
    assert long_share([64] * 20) == LengthSummary(64.0, 1.0)
    assert long_share([]) == LengthSummary(0.0, 0.0)
    assert long_share([0, 0]) == LengthSummary(0.0, 0.0)


def test_the_window_keeps_the_last_samples_only():
    window = LengthWindow(size=10)
    window.add([1000] * 5)
    window.add([10] * 9 + [100])  # pushes the long early answers out
    assert window.summary() == LengthSummary(100.0, pytest.approx(100 / 190))
