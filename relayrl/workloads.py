"""The realistic length mix: one definition for every benchmark that shapes work like RL rollouts.

Response lengths of reasoning RL are long-tailed: most answers are short, a few run to the budget.
``relayrl bench e2e --workload realistic`` draws each prompt's response budget from this mix, and
``relayrl bench trainer --workload realistic`` each synthetic response's length, scaled to its cap.
"""

from __future__ import annotations

import math
import random

REALISTIC_MEDIAN_TOKENS = 64
REALISTIC_MAX_TOKENS = 512
# ln(8) / z(0.99) = 0.894 puts the 99th percentile at exactly 8× the median; a little wider keeps
# it there after the cap at 512.
REALISTIC_SIGMA = 0.95
REALISTIC_MIN_TOKENS = 4


def realistic_length(rng: random.Random, cap: int = REALISTIC_MAX_TOKENS) -> int:
    """One length from the log-normal mix with its median at 1/8 of ``cap`` (64 of 512), cut to
    [REALISTIC_MIN_TOKENS, cap]."""
    median = cap * REALISTIC_MEDIAN_TOKENS / REALISTIC_MAX_TOKENS
    return min(max(round(median * math.exp(rng.gauss(0.0, REALISTIC_SIGMA))), REALISTIC_MIN_TOKENS), cap)
