"""The workloads ``relayrl bench e2e`` runs: each a dataset file and the trainer settings that shape it.

- ``toy``: copy 1, 8 or 32 bits (85 / 10 / 5 % of prompts), each with a response budget just
  above its answer; 4 samples per prompt, 8 prompts per step. Every figure RelayRL reported
  before real-shaped work was measured on it.
- ``realistic``: each prompt's response budget is drawn from a long-tailed (log-normal)
  distribution, median 64 tokens, 99th percentile 8× the median, capped at 512; the answer
  (the ``repeat`` task: a digit pattern repeated k times) fills the budget, and prompts are 16 to
  128 tokens with the chat template. 8 samples per prompt and 8 prompts per step, as in GRPO
  recipes; partial rollout in place, since re-prefilling hundreds of generated tokens at every
  weight version would cost more than decoding them.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relayrl.tasks import get_task

# (bits to copy, share of prompts): the toy workload's long tail.
TOY_LENGTH_MIX = ((1, 0.85), (8, 0.10), (32, 0.05))

REALISTIC_MEDIAN_TOKENS = 64
REALISTIC_MAX_TOKENS = 512
# ln(8) / z(0.99) = 0.894 puts the 99th percentile at exactly 8× the median; a little wider keeps
# it there after the cap at 512.
REALISTIC_SIGMA = 0.95
REALISTIC_MIN_TOKENS = 4


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    n_samples: int
    batch_size: int
    max_new_tokens: int
    lr: float
    write_dataset: Callable[[Path, int, int], Path]
    # Rollout settings of this workload (beside the bench's own).
    rollout: dict[str, Any] = field(default_factory=dict)
    # Trainer steps of the bench's sync and async runs, and of its stage-alone run.
    bench_steps: int = 100
    bench_alone_steps: int = 10

    def trainer_settings(self, dataset: Path, steps: int, seed: int) -> dict[str, Any]:
        return {
            "dataset": str(dataset),
            "n_samples": self.n_samples,
            "batch_size": self.batch_size,
            "max_new_tokens": self.max_new_tokens,
            "total_steps": steps,
            "checkpoint_every": steps,
            "lr": self.lr,
            "seed": seed,
        }


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def toy_dataset(path: Path, rows: int, seed: int) -> Path:
    rng = random.Random(seed)
    lengths, weights = zip(*TOY_LENGTH_MIX, strict=True)
    out = []
    for index in range(rows):
        bits = "".join(rng.choice("01") for _ in range(rng.choices(lengths, weights)[0]))
        out.append(
            {
                "data_source": "relayrl/copy_bits",
                "prompt": [{"role": "user", "content": f"copy {bits}"}],
                "ability": "copy",
                "reward_model": {"style": "rule", "ground_truth": bits},
                "extra_info": {"index": index, "max_new_tokens": len(bits) + 2},
            }
        )
    return _write_rows(path, out)


def realistic_budget(rng: random.Random) -> int:
    """One response budget in tokens from the realistic workload's long-tailed distribution."""
    budget = round(REALISTIC_MEDIAN_TOKENS * math.exp(rng.gauss(0.0, REALISTIC_SIGMA)))
    return min(max(budget, REALISTIC_MIN_TOKENS), REALISTIC_MAX_TOKENS)


def realistic_dataset(path: Path, rows: int, seed: int) -> Path:
    rng = random.Random(seed)
    task = get_task("repeat")
    out = []
    for index in range(rows):
        budget = realistic_budget(rng)
        # The answer leaves room for the end-of-turn token.
        question, answer = task.generate(rng, budget - 1)
        out.append(
            {
                "data_source": task.data_source,
                "prompt": [{"role": "user", "content": question}],
                "ability": task.ability,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"index": index, "max_new_tokens": budget},
            }
        )
    return _write_rows(path, out)


WORKLOADS: dict[str, Workload] = {
    "toy": Workload("toy", n_samples=4, batch_size=8, max_new_tokens=40, lr=0.003, write_dataset=toy_dataset),
    "realistic": Workload(
        "realistic",
        n_samples=8,
        batch_size=8,
        max_new_tokens=REALISTIC_MAX_TOKENS,
        lr=0.001,
        write_dataset=realistic_dataset,
        rollout={"partial_rollout_mode": "in_place"},
        bench_steps=10,
        bench_alone_steps=4,
    ),
}


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}") from None
