"""Dynamic sampling's verdict on a group (which groups carry no signal, and why) and the batch's shares of them."""

from __future__ import annotations

from relayrl.schema import Group, Sample
from services.trainer.filtering import no_signal_reason, signal_metrics


def group(*rewards: float, extra: list[dict[str, float]] | None = None) -> Group:
    extras = extra or [{} for _ in rewards]
    samples = [Sample([1], [2], [-0.1], [0], reward=r, reward_extra=e) for r, e in zip(rewards, extras, strict=True)]
    return Group(group_id="g", prompt_id="p", samples=samples)


def test_uniform_groups_are_dropped_with_their_reason() -> None:
    assert no_signal_reason(group(1.0, 1.0, 1.0), "score") == "all_solved"
    assert no_signal_reason(group(0.0, 0.0), "score") == "all_failed"
    assert no_signal_reason(group(-0.5, -0.5), "score") == "all_failed"
    assert no_signal_reason(group(1.0, 0.0, 1.0), "score") is None


def test_metric_may_be_a_reward_extra_key() -> None:
    # Overlong penalties make the scores differ while accuracy (the raw score) does not.
    g = group(0.75, 1.0, extra=[{"raw_score": 1.0}, {"raw_score": 1.0}])
    assert no_signal_reason(g, "score") is None
    assert no_signal_reason(g, "raw_score") == "all_solved"
    # A sample without the key is judged by its score.
    assert no_signal_reason(group(0.0, 0.0), "acc") == "all_failed"


def test_seq_reward_adds_an_episodes_per_turn_rewards_to_its_score() -> None:
    # Both episodes end solved, but only one earned its first turn's reward: a signal to keep.
    solved = [Sample([1], [2, 3], [-0.1, -0.1], [0, 0], reward=1.0, token_rewards=t) for t in ([0.5, 0.0], [0.0, 0.0])]
    g = Group(group_id="g", prompt_id="p", samples=solved)
    assert no_signal_reason(g, "score") == "all_solved"
    assert no_signal_reason(g, "seq_reward") is None


def test_a_batch_reports_the_shares_of_its_groups_without_signal() -> None:
    # What a policy that gives one answer to every prompt leaves: each group solved or failed whole.
    batch = [group(1.0, 1.0), group(0.0, 0.0), group(0.0, 0.0), group(1.0, 0.0)]
    assert signal_metrics(batch, "score") == {
        "batch/no_signal_frac": 0.75,
        "batch/all_solved_frac": 0.25,
        "batch/all_failed_frac": 0.5,
    }
    assert signal_metrics([group(1.0, 0.5)], "score")["batch/no_signal_frac"] == 0.0
