"""Response lengths of the groups pushed, over a sliding window: what "the longest answers
generated" means when the trainer checks that it trains on its share of them (length bias).

Asynchronous training can starve long answers: they take longest to generate, so they are the
likeliest to be dropped as stale, and they arrive last. The queue sees every group generated
(evaluation groups aside), before any drop, so the reference is measured here: the length of
the shortest of the longest 10 % of answers, and the share of response tokens in answers at
least that long (ties at the threshold count as long, so a window of equal lengths is all long).
The trainer compares the same share among the tokens it trains on.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

# "Long" answers: this fraction of the answers generated, the longest ones.
LONG_FRACTION = 0.1


@dataclass(frozen=True, slots=True)
class LengthSummary:
    # The shortest length among the longest LONG_FRACTION of answers, tokens; 0 before any push.
    long_threshold_tokens: float
    # Share of the window's response tokens in answers at least that long.
    long_token_share: float


class LengthWindow:
    """The response lengths of the last ``size`` samples pushed."""

    def __init__(self, size: int) -> None:
        self._lengths: deque[int] = deque(maxlen=size)

    def add(self, lengths: Iterable[int]) -> None:
        self._lengths.extend(lengths)

    def summary(self) -> LengthSummary:
        return long_share(list(self._lengths))


def long_share(lengths: list[int]) -> LengthSummary:
    """The long-answer threshold of ``lengths`` and the share of their tokens at or above it."""
    total = sum(lengths)
    if not total:
        return LengthSummary(0.0, 0.0)
    ordered = sorted(lengths)
    threshold = ordered[-math.ceil(LONG_FRACTION * len(ordered))]
    return LengthSummary(float(threshold), sum(n for n in ordered if n >= threshold) / total)
