"""The bench's workloads: the realistic one has the long tail and the prompt lengths it promises; the
agentic one is the guess game behind an environment that really takes its latency."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from pathlib import Path

import pytest

from commands.stack.environment import read_calls
from commands.stack.workloads import (
    WORKLOADS,
    agentic_dataset,
    get_workload,
    realistic_budget,
    realistic_dataset,
    toy_dataset,
)
from relayrl.models.loading import load_tokenizer
from relayrl.models.tiny import init_tiny
from relayrl.tasks import score_builtin
from services.rollout.agent.interactions import load_interactions, pick_interaction
from services.rollout.config import RolloutSettings
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
    with pytest.raises(ValueError, match="choose one of toy, realistic, agentic"):
        get_workload("huge")


def test_agentic_rows_are_guess_games_of_three_guesses_whose_turns_fit_the_budget(tmp_path: Path):
    rows = [json.loads(line) for line in agentic_dataset(tmp_path / "a.jsonl", 200, seed=0).open()]
    workload = get_workload("agentic")
    for row in rows:
        game = row["extra_info"]["interaction_kwargs"]
        assert row["prompt"][0]["content"] == "guess 0-6"
        assert game == {"name": "guess", "secret": int(row["reward_model"]["ground_truth"]), "max_turns": 3}
        assert 0 <= game["secret"] <= 6
    assert len({row["reward_model"]["ground_truth"] for row in rows}) == 7
    # Valid rollout settings: multi-turn, one turn per guess, and room for a whole step ahead.
    settings = RolloutSettings(**workload.rollout, max_new_tokens=workload.max_new_tokens)
    assert settings.multi_turn_enable and settings.multi_turn_max_assistant_turns == 3
    assert settings.max_inflight_prompts >= 3 * workload.batch_size
    in_flight_episodes = settings.max_inflight_prompts * workload.n_samples
    assert settings.multi_turn_tool_concurrency >= in_flight_episodes
    assert workload.engine["max_running_requests"] >= in_flight_episodes


def test_agentic_environment_answers_as_the_game_after_its_latency_and_logs_each_call(tmp_path: Path):
    workload = get_workload("agentic")
    assert workload.environment is not None and WORKLOADS["toy"].environment is None
    settings = workload.environment(tmp_path / "env", 150.0)
    interactions = load_interactions(settings["multi_turn_interaction_config_path"])
    game = {"name": "guess", "secret": 5, "max_turns": 3}
    interaction = pick_interaction(interactions, game)

    async def play() -> list[tuple[float, tuple]]:
        instance = await interaction.start_interaction(None, **game)
        replies = []
        for guess in ("3", "6", "5"):
            started = time.perf_counter()
            reply = await interaction.generate_response(instance, [{"role": "assistant", "content": guess}], **game)
            replies.append((time.perf_counter() - started, reply))
        assert await interaction.calculate_score(instance) == 1.0
        return replies

    before = time.time()
    replies = asyncio.run(play())
    assert [reply[:2] for _, reply in replies] == [(False, "higher"), (False, "lower"), (True, "correct")]
    assert all(seconds >= 0.15 for seconds, _ in replies)
    calls = read_calls(tmp_path / "env" / "calls.log", before, time.time())
    assert calls.count == 3 and 0.45 <= calls.seconds <= sum(seconds for seconds, _ in replies)
    assert read_calls(tmp_path / "env" / "calls.log", 0.0, before).count == 0


def test_waiting_environments_overlap_instead_of_queueing(tmp_path: Path):
    """The latency is an await, as a network call's: 20 games waiting at once take one latency, not 20."""
    interaction = next(iter(load_interactions(_environment(tmp_path, 200.0)).values()))
    game = {"name": "guess", "secret": 0, "max_turns": 3}

    async def one() -> None:
        instance = await interaction.start_interaction(None, **game)
        await interaction.generate_response(instance, [{"role": "assistant", "content": "4"}], **game)

    async def many() -> None:
        await asyncio.gather(*(one() for _ in range(20)))

    started = time.perf_counter()
    asyncio.run(many())
    assert 0.2 <= time.perf_counter() - started < 1.0


def _environment(tmp_path: Path, latency_ms: float) -> str:
    environment = get_workload("agentic").environment
    assert environment is not None
    return environment(tmp_path / "env", latency_ms)["multi_turn_interaction_config_path"]


def _tokenizer(tmp_path: Path):
    return load_tokenizer(init_tiny(tmp_path / "model"))


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path: Path) -> None:
    from commands.stack.workloads import native_bf16

    with_bf16, without = tmp_path / "with", tmp_path / "without"
    with_bf16.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n")
    without.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n")
    assert native_bf16(with_bf16) and not native_bf16(without)
    assert not native_bf16(tmp_path / "missing")
