"""Each recipe config in commands/stack/configs/ trains a few steps on the whole local stack."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from commands.stack.config import StackConfig
from tests.e2e.conftest import running_stack, small_run, training_rows, wait_for_trainer

CONFIGS = Path(__file__).resolve().parents[2] / "commands" / "stack" / "configs"
STEPS = 3

# The metric each recipe must put in every training row (its own evidence that it ran).
EVIDENCE = {
    "dapo": "filter_groups/gen_batches_per_batch",
    "icepop": "mismatch/masked_frac",
    "topr": "actor/pg_loss",
    "kimi15": "actor/pg_loss",
}


@pytest.mark.parametrize("recipe", sorted(EVIDENCE))
def test_recipe_config_trains(recipe, runs_dir, tiny_model_dir):
    recipe_cfg = StackConfig.from_yaml(CONFIGS / f"{recipe}.yaml")
    config = small_run(runs_dir, tiny_model_dir, max_staleness=1, total_steps=STEPS)
    # The recipe's own settings on top; the small run's sizing (task, batch, lengths) on top of those.
    config.trainer = {**recipe_cfg.trainer, **config.trainer, "save_freq": 1}
    config.rollout = {**recipe_cfg.rollout, **config.rollout}
    if recipe == "dapo":
        config.rollout["overlong_buffer_len"] = 1
        config.trainer["max_num_gen_batches"] = 0
    with running_stack(config) as stack:
        assert wait_for_trainer(stack, timeout_s=240) == 0
    rows = training_rows(stack)
    assert [r["trainer/global_steps"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        assert math.isfinite(row["actor/pg_loss"]) and row["actor/nonfinite_grad_steps"] == 0
        assert EVIDENCE[recipe] in row, f"{recipe}: {EVIDENCE[recipe]} missing from step {row['trainer/global_steps']}"
    if recipe == "dapo":
        # The untrained model mostly fails copy_bits, so most groups carry no signal: each dropped one is
        # counted and made up for by a new prompt, and every trained batch is full anyway.
        assert all(r["filter_groups/gen_batches_per_batch"] >= 1.0 for r in rows)
        assert all(r["actor/grad_norm"] > 0 for r in rows), "a batch of informative groups gave no gradient"
        assert rows[-1]["filter_groups/dropped_total"] == sum(r["filter_groups/dropped"] for r in rows)
    if recipe == "icepop":
        assert all(0.0 <= r["mismatch/masked_frac"] <= 1.0 and r["mismatch/ratio_q05"] > 0 for r in rows)


def test_the_reasoning_recipe_scores_its_held_out_split_before_training_and_trains(runs_dir, tiny_model_dir):
    recipe_cfg = StackConfig.from_yaml(CONFIGS / "long_add.yaml")
    config = small_run(runs_dir, tiny_model_dir, max_staleness=recipe_cfg.stack.max_staleness, total_steps=STEPS)
    # The recipe's task, lengths and validation; the small run's batch, and a short held-out set.
    sizing = {"n_samples": 4, "batch_size": 4, "val_size": 4, "total_steps": STEPS, "test_freq": STEPS}
    config.trainer = {**recipe_cfg.trainer, **sizing, "save_freq": STEPS}
    config.rollout = {**recipe_cfg.rollout, "max_inflight_prompts": 8}
    with running_stack(config) as stack:
        assert wait_for_trainer(stack, timeout_s=240) == 0
    before, *rows = training_rows(stack)
    held_out = "val/test_score/relayrl/long_add"
    # Step 0 is the starting policy on every held-out prompt; then the training steps, validated at the last.
    assert before["trainer/global_steps"] == 0 and before["val/returned_ratio"] == 1.0 and held_out in before
    assert [r["trainer/global_steps"] for r in rows] == list(range(1, STEPS + 1))
    assert held_out in rows[-1] and 0.0 <= rows[-1][held_out] <= 1.0
    # An untrained model rambles to the recipe's 64-token budget instead of stopping after 3 tokens.
    assert all(r["response_length/mean"] > 3 for r in rows)
