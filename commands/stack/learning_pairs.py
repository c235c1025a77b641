"""``relayrl bench learning --against FILE``: two training configs on the same seeds, side by side.

Two sweeps of one config run at different times differ by the machine's load as well as by chance:
the demo's sweep beside a busy core took longer per run, and one config reached the threshold in
10 of 10 seeds in one sweep and 8 of 10 in the next. So a comparison of two configs runs them
interleaved: each seed trains both, back to back, config A first at even positions and config B first
at odd ones, so a drift in the machine's load over the sweep falls on both alike. A seed's two runs
share the model's initialisation, the data order and the sampling seed, so the comparison is paired:

- reaching the threshold: McNemar's exact test, on the seeds where exactly one config reached it
  (a seed where both or neither did says nothing about which is better);
- ``reward_last``: the spread of each seed's difference B − A, over the seeds where both finished;
- wall time: the spread of each seed's ratio B / A, measured under the same conditions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commands.stack.config import StackConfig
from commands.stack.learning import (
    Distribution,
    LearningResult,
    Runner,
    SeedRun,
    distribution,
    render_table,
    result_json,
    rounded_json,
    run_logged,
)

NAMES = ("a", "b")


def order(position: int) -> tuple[str, str]:
    """Which config trains first at this position in the sweep: A at even positions, B at odd."""
    return NAMES if position % 2 == 0 else (NAMES[1], NAMES[0])


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided p of McNemar's exact test. If neither config reaches the threshold more often, each
    seed where exactly one of them did is a fair coin's toss between A and B; p is the chance of a
    split at least as uneven as this one."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True, slots=True)
class Pairing:
    """Seed by seed, config A's run against config B's."""

    seeds: tuple[int, ...]
    both: int
    only_a: int
    only_b: int
    neither: int
    # Over the seeds where both runs finished: B's reward_last minus A's, and B's wall time over A's.
    reward_last_diff: Distribution | None
    wall_s_ratio: Distribution | None

    @property
    def first(self) -> tuple[str, ...]:
        """Which config trained first for each seed ("a" or "b"), as ``run_pairs`` ran them."""
        return tuple(order(position)[0] for position in range(len(self.seeds)))

    @property
    def mcnemar_p(self) -> float:
        return mcnemar_exact(self.only_a, self.only_b)


def pair(a: list[SeedRun], b: list[SeedRun], threshold: float) -> Pairing:
    if [run.seed for run in a] != [run.seed for run in b]:
        raise ValueError("the two configs' runs must be of the same seeds in the same order")
    reached = [(x.reached(threshold), y.reached(threshold)) for x, y in zip(a, b, strict=True)]
    finished = [(x.report, y.report) for x, y in zip(a, b, strict=True) if x.report and y.report]
    return Pairing(
        seeds=tuple(run.seed for run in a),
        both=sum(x and y for x, y in reached),
        only_a=sum(x and not y for x, y in reached),
        only_b=sum(y and not x for x, y in reached),
        neither=sum(not x and not y for x, y in reached),
        reward_last_diff=distribution([y.reward_last - x.reward_last for x, y in finished]),
        wall_s_ratio=distribution([y.wall_s / x.wall_s for x, y in finished if x.wall_s > 0]),
    )


def run_pairs(
    configs: dict[str, StackConfig], seeds: list[int], out: Path, steps: int | None, timeout_s: float, runner: Runner
) -> dict[str, list[SeedRun]]:
    """Every seed with both configs, in ``order``; config X's runs in ``out/<x>/seed-<k>``."""
    runs: dict[str, list[SeedRun]] = {name: [] for name in NAMES}
    for position, seed in enumerate(seeds):
        for name in order(position):
            label = f"seed {seed} ({position + 1} of {len(seeds)}), config {name.upper()}"
            runs[name].append(run_logged(configs[name], seed, out / name, steps, timeout_s, runner, label))
    return runs


def pairs_json(a: LearningResult, b: LearningResult, pairing: Pairing) -> dict[str, Any]:
    return {
        "benchmark": "learning-pairs",
        "seeds": list(pairing.seeds),
        "threshold": a.threshold,
        "a": result_json(a),
        "b": result_json(b),
        "paired": {
            "first": list(pairing.first),
            "both": pairing.both,
            "only_a": pairing.only_a,
            "only_b": pairing.only_b,
            "neither": pairing.neither,
            "mcnemar_p": round(pairing.mcnemar_p, 4),
            "reward_last_diff": rounded_json(pairing.reward_last_diff, 3),
            "wall_s_ratio": rounded_json(pairing.wall_s_ratio, 3),
        },
    }


def render_pairs(a: LearningResult, b: LearningResult, pairing: Pairing) -> str:
    lines = [f"config A: {a.config}", render_table(a), f"config B: {b.config}", render_table(b)]
    lines.append(
        f"paired over {len(pairing.seeds)} seeds (A first at even positions, B first at odd):"
        f" reached reward_last ≥ {a.threshold:g} with both {pairing.both}, only A {pairing.only_a},"
        f" only B {pairing.only_b}, neither {pairing.neither}; McNemar's exact p = {pairing.mcnemar_p:.3f}"
    )
    if pairing.reward_last_diff is not None:
        diff = pairing.reward_last_diff
        lines.append(
            f"reward_last B − A per seed: median {diff.median:+.3f} (min {diff.min:+.3f}, max {diff.max:+.3f})"
        )
    if pairing.wall_s_ratio is not None:
        ratio = pairing.wall_s_ratio
        lines.append(f"wall time B / A per seed: median {ratio.median:.3f} (min {ratio.min:.3f}, max {ratio.max:.3f})")
    return "\n".join(lines)
