"""DAPO's dynamic sampling (verl ``algorithm.filter_groups``): a group whose samples all carry the
same value of the filter metric has zero advantage under GRPO/RLOO and teaches nothing, so it is
dropped before training and made up for by a replacement prompt. Every trained batch reports the share of
such groups it holds (:func:`signal_metrics`), which without dynamic sampling is how a stalled run shows."""

from __future__ import annotations

from relayrl.schema import Group, Sample


def metric_value(sample: Sample, metric: str) -> float:
    """verl's names: ``score`` (the stored, possibly penalised score), ``seq_reward`` (the sum of
    the token-level rewards: the score plus an episode's per-turn rewards); anything else is a
    ``reward_extra`` key (``acc``, ``raw_score``, ...), falling back to the score when a sample
    lacks it."""
    if metric == "score":
        return sample.reward
    if metric == "seq_reward":
        return sample.total_reward
    return sample.reward_extra.get(metric, sample.reward)


def no_signal_reason(group: Group, metric: str) -> str | None:
    """``all_solved`` / ``all_failed`` when every sample has the same value (> 0 / <= 0), else None.

    A single-sample group has no within-group signal either and is dropped the same way.
    """
    values = [metric_value(s, metric) for s in group.samples]
    if not values or max(values) != min(values):
        return None
    return "all_solved" if values[0] > 0 else "all_failed"


def signal_metrics(groups: list[Group], metric: str) -> dict[str, float]:
    """Shares of a batch's groups that teach GRPO nothing: ``batch/no_signal_frac`` (TRL's
    ``frac_reward_zero_std``), split as dynamic sampling splits them: all solved (alike above 0) and all
    failed (alike at 0 or below). A policy that learned its task ends with groups alike too, but few
    failed whole; one that gives one answer to every prompt fails every group of the other answer whole."""
    reasons = [no_signal_reason(g, metric) for g in groups]
    n = max(len(groups), 1)
    return {
        "batch/no_signal_frac": sum(r is not None for r in reasons) / n,
        "batch/all_solved_frac": reasons.count("all_solved") / n,
        "batch/all_failed_frac": reasons.count("all_failed") / n,
    }
