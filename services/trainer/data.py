"""The trainer's dataset: verl-format rows (parquet, jsonl or a built-in task) turned into
prompt token ids with the tokenizer's chat template, served in a seeded shuffled order whose
position is saved in checkpoints (so a restart continues where it stopped)."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relayrl.schema import PromptSpec
from relayrl.tasks import make_rows

log = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True, slots=True)
class PromptRow:
    prompt_id: str  # "<dataset>/<row index>", stable across epochs
    prompt_ids: list[int]
    data_source: str
    ground_truth: str
    extra_info: dict[str, Any]


def read_rows(source: str, size: int, difficulty: int, seed: int, split: str) -> list[dict[str, Any]]:
    """verl rows from ``builtin:<task>``, a ``.parquet`` or a ``.jsonl`` file."""
    if source.startswith(BUILTIN_PREFIX):
        return make_rows(source.removeprefix(BUILTIN_PREFIX), size, seed=seed, difficulty=difficulty, split=split)
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"dataset {source!r} is neither builtin:<task> nor an existing file")
    if path.suffix == ".parquet":
        from relayrl.extras import require

        pq = require("pyarrow.parquet", "parquet", f"dataset {source!r}")
        return pq.read_table(path).to_pylist()
    if path.suffix in (".jsonl", ".json"):
        with path.open() as f:
            return [json.loads(line) for line in f if line.strip()]
    raise ValueError(f"dataset {source!r}: expected a .parquet or .jsonl file")


def _chat(prompt: Any) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


def tokenize_rows(rows: list[dict[str, Any]], tokenizer: Any, name: str, max_prompt_tokens: int) -> list[PromptRow]:
    """Applies the chat template (generation prompt opened) and drops over-long prompts, logging how many."""
    out, skipped = [], 0
    for index, row in enumerate(rows):
        text = tokenizer.apply_chat_template(_chat(row["prompt"]), tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_prompt_tokens:
            skipped += 1
            continue
        reward_model = row.get("reward_model") or {}
        extra = row.get("extra_info") or {}
        prompt_row = PromptRow(
            prompt_id=f"{name}/{index}",
            prompt_ids=list(ids),
            data_source=str(row.get("data_source", "")),
            ground_truth=str(reward_model.get("ground_truth", "")),
            extra_info=dict(extra) if isinstance(extra, dict) else {"value": extra},
        )
        response_budget(prompt_row, 1)  # a bad per-row budget fails at load time, not mid-run
        out.append(prompt_row)
    if skipped:
        log.warning("%s: skipped %d prompts longer than %d tokens", name, skipped, max_prompt_tokens)
    if not out:
        raise ValueError(f"dataset {name!r} has no usable prompts")
    return out


@dataclass(slots=True)
class DataPosition:
    epoch: int = 0
    index: int = 0  # next position inside the epoch's permutation


@dataclass
class PromptDataset:
    """Rows served epoch after epoch, each epoch in its own seeded order."""

    rows: list[PromptRow]
    seed: int
    position: DataPosition = field(default_factory=DataPosition)

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def take(self, count: int) -> list[PromptRow]:
        taken = []
        order = self._order(self.position.epoch)
        while len(taken) < count:
            if self.position.index >= len(order):
                self.position = DataPosition(self.position.epoch + 1, 0)
                order = self._order(self.position.epoch)
            taken.append(self.rows[order[self.position.index]])
            self.position.index += 1
        return taken

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.position.epoch, "index": self.position.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = DataPosition(int(state["epoch"]), int(state["index"]))


def response_budget(row: PromptRow, default: int) -> int:
    """Response tokens allowed for ``row``: ``extra_info.max_new_tokens`` when a row carries one
    (datasets whose answers differ in length), never more than the run's ``max_new_tokens``."""
    budget = row.extra_info.get("max_new_tokens")
    if budget is None:
        return default
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"{row.prompt_id}: extra_info.max_new_tokens must be a positive integer, got {budget!r}")
    return min(budget, default)


def to_spec(
    row: PromptRow, n_samples: int, min_start_version: int, version: int, now: float, **sampling: Any
) -> PromptSpec:
    return PromptSpec(
        prompt_id=row.prompt_id,
        prompt_token_ids=row.prompt_ids,
        n_samples=n_samples,
        data_source=row.data_source,
        ground_truth=row.ground_truth,
        extra_info=row.extra_info,
        min_start_version=min_start_version,
        released_at_version=version,
        released_at_unix_s=now,
        **sampling,
    )
