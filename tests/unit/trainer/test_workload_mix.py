"""One realistic length mix: `relayrl bench trainer --workload realistic` draws the lengths that
`relayrl bench e2e --workload realistic` budgets, scaled to its cap (relayrl/workloads.py)."""

from __future__ import annotations

import random

from commands.stack.workloads import realistic_budget
from services.trainer.bench import BenchConfig, response_length


def test_the_trainer_bench_draws_the_e2e_budgets_at_the_e2e_cap_and_scales_with_its_own():
    at_512 = BenchConfig(workload="realistic", response_len=512)
    rng_a, rng_b = random.Random(7), random.Random(7)
    assert [response_length(at_512, rng_a) for _ in range(2000)] == [realistic_budget(rng_b) for _ in range(2000)]

    at_4096 = BenchConfig(workload="realistic", response_len=4096)
    rng_a, rng_b = random.Random(7), random.Random(7)
    scaled = [response_length(at_4096, rng_a) for _ in range(2000)]
    budgets = [realistic_budget(rng_b) for _ in range(2000)]
    # The same draws with 8× the median and the cap: 8× each budget the floor and cap left alone,
    # within the rounding of the budget (8 × 0.5 tokens) and of the scaled length.
    inside = [(s, b) for s, b in zip(scaled, budgets, strict=True) if 4 < b < 512]
    assert len(inside) > 1900 and all(abs(s - 8 * b) <= 4.5 for s, b in inside)
    assert max(scaled) == 4096
