"""Length bias: does the trainer train on its share of the long answers that were generated?

The queue measures, over the samples pushed, the length at which an answer is among the
longest 10 % and the share of response tokens in such answers (``QueueStats``'s
``generated_long_*``). This compares the same share among the response tokens of each trained
batch, and over the run. A ratio below 1 means long answers are lost on the way (stale drops hit
them first, or they arrive too late); see the README's "Length bias".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LengthBias:
    """Response tokens trained, and those from long answers, over this trainer's steps."""

    long_tokens: int = 0
    tokens: int = 0

    def record(self, lengths: list[int], threshold: float, generated_share: float) -> dict[str, float]:
        """The metrics of one trained batch with response ``lengths``; none before the queue has a threshold."""
        total = sum(lengths)
        if threshold <= 0 or not total:
            return {}
        long = sum(n for n in lengths if n >= threshold)
        self.long_tokens += long
        self.tokens += total
        trained_share = long / total
        run_share = self.long_tokens / self.tokens
        metrics = {
            "length_bias/long_threshold_tokens": threshold,
            "length_bias/generated_long_share": generated_share,
            "length_bias/trained_long_share": trained_share,
            "length_bias/trained_long_share_run": run_share,
        }
        if generated_share > 0:
            metrics["length_bias/trained_to_generated_run"] = run_share / generated_share
        return metrics
