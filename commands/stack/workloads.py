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
- ``agentic``: the multi-turn ``guess`` game (find a secret in 0-6 in three guesses; the
  environment answers each guess "higher" or "lower"), each episode up to three model turns of
  two tokens with an environment reply between them. The environment answers after
  ``--tool-latency-ms`` (200 ms by default) of real waiting inside its call
  (:mod:`commands.stack.environment`). 8 episodes per prompt and 8 prompts per step, as a GRPO
  recipe would; the rollout may hold 32 prompts (256 episodes) and the engine batch 256 sequences
  so that, when the staleness bound lets the trainer release prompts ahead, episodes waiting on
  the environment overlap others generating. At η = 0 the trainer releases one step's 8 prompts
  at a time, so these limits are never reached there: sync runs with the same settings and the
  same per-step batch.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from relayrl.tasks import get_task, make_rows
from relayrl.workloads import REALISTIC_MAX_TOKENS
from relayrl.workloads import realistic_length as realistic_budget

# (bits to copy, share of prompts): the toy workload's long tail.
TOY_LENGTH_MIX = ((1, 0.85), (8, 0.10), (32, 0.05))

# guess 0-6 in three guesses: a binary search wins every game, a guess that ignores the replies a third.
AGENTIC_DIFFICULTY = 3
AGENTIC_MAX_NEW_TOKENS = 96
DEFAULT_TOOL_LATENCY_MS = 200.0


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
    engine: dict[str, Any] = field(default_factory=dict)
    # Multi-turn workloads: writes the environment's configs into a directory for a latency per
    # call (ms) and returns the rollout settings that name them; None: single-turn.
    environment: Callable[[Path, float], dict[str, Any]] | None = None
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
            "save_freq": steps,
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


def agentic_dataset(path: Path, rows: int, seed: int) -> Path:
    return _write_rows(path, make_rows("guess", rows, seed=seed, difficulty=AGENTIC_DIFFICULTY))


def agentic_environment(directory: Path, latency_ms: float) -> dict[str, Any]:
    """The guess game's interaction behind ``latency_ms`` per reply, logging its calls to ``calls.log``."""
    directory.mkdir(parents=True, exist_ok=True)
    inner = {"interaction": "relayrl.tasks.guess.GuessInteraction", "config": {}}
    config = {**inner, "latency_ms": latency_ms, "call_log": str(directory / "calls.log")}
    entry = {"name": "guess", "class_name": "commands.stack.environment.SlowInteraction", "config": config}
    path = directory / "interaction.yaml"
    path.write_text(yaml.safe_dump({"interaction": [entry]}))
    return {"multi_turn_interaction_config_path": str(path)}


WORKLOADS: dict[str, Workload] = {
    "toy": Workload("toy", n_samples=4, batch_size=8, max_new_tokens=40, lr=0.003, write_dataset=toy_dataset),
    "realistic": Workload(
        "realistic",
        n_samples=8,
        batch_size=8,
        max_new_tokens=REALISTIC_MAX_TOKENS,
        lr=0.001,
        write_dataset=realistic_dataset,
        bench_steps=10,
        bench_alone_steps=4,
    ),
    "agentic": Workload(
        "agentic",
        n_samples=8,
        batch_size=8,
        max_new_tokens=AGENTIC_MAX_NEW_TOKENS,
        lr=0.001,
        write_dataset=agentic_dataset,
        rollout={
            "multi_turn_enable": True,
            "multi_turn_max_assistant_turns": AGENTIC_DIFFICULTY,
            # One guess per turn: a digit and the end of the turn.
            "multi_turn_max_tokens_per_turn": 2,
            "max_inflight_prompts": 32,
            # Every episode in flight may be waiting on the environment at once.
            "multi_turn_tool_concurrency": 256,
        },
        engine={"max_running_requests": 256},
        environment=agentic_environment,
        bench_steps=20,
        bench_alone_steps=6,
    ),
}


# The bench's --dtype: the trainer's FSDP2 param_dtype and the engine's weights.
DTYPES = ("fp32", "bf16")


def native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX); without it torch emulates
    bf16 and is slower than fp32."""
    try:
        flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}") from None
