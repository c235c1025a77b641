"""The bench's workloads: the realistic one has the long tail and the prompt lengths it promises."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from relayrl.models.loading import load_tokenizer
from relayrl.models.tiny import init_tiny
from relayrl.stack.workloads import WORKLOADS, get_workload, realistic_budget, realistic_dataset, toy_dataset
from relayrl.tasks import score_builtin
from services.trainer.data import read_rows, tokenize_rows


def test_realistic_budgets_have_a_long_tail_median_64_p99_eight_times_max_512():
    rng = random.Random(1)
    budgets = sorted(realistic_budget(rng) for _ in range(20_000))
    median, p99 = statistics.median(budgets), budgets[int(0.99 * len(budgets))]
    assert 60 <= median <= 68
    assert p99 >= 8 * median
    assert max(budgets) == 512 and min(budgets) >= 4


def test_realistic_prompts_are_16_to_128_tokens_and_answers_fit_their_budget(tmp_path: Path):
    rows = [json.loads(line) for line in realistic_dataset(tmp_path / "r.jsonl", 500, seed=3).open()]
    tokenized = tokenize_rows(read_rows(str(tmp_path / "r.jsonl"), 0, 1, 0, "train"), _tokenizer(tmp_path), "r", 512)
    assert len(tokenized) == 500
    assert all(16 <= len(row.prompt_ids) <= 128 for row in tokenized)
    for row in rows:
        answer, budget = row["reward_model"]["ground_truth"], row["extra_info"]["max_new_tokens"]
        assert 1 <= len(answer) < budget
        # The byte-level tokenizer spends one token per digit: the right answer fits with its end token.
        assert score_builtin(row["data_source"], answer, answer) == 1.0


def test_toy_workload_is_unchanged_copy_bits_with_its_length_mix(tmp_path: Path):
    rows = [json.loads(line) for line in toy_dataset(tmp_path / "t.jsonl", 2000, seed=0).open()]
    lengths = [len(r["reward_model"]["ground_truth"]) for r in rows]
    assert set(lengths) == {1, 8, 32} and 0.8 < lengths.count(1) / len(lengths) < 0.9
    assert all(r["extra_info"]["max_new_tokens"] == len(r["reward_model"]["ground_truth"]) + 2 for r in rows)
    assert (WORKLOADS["toy"].n_samples, WORKLOADS["realistic"].n_samples) == (4, 8)


def test_an_unknown_workload_names_the_choices():
    with pytest.raises(ValueError, match="choose one of toy, realistic"):
        get_workload("huge")


def _tokenizer(tmp_path: Path):
    return load_tokenizer(init_tiny(tmp_path / "model"))
