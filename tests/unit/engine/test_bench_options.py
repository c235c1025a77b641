"""The engine benches' options that need no engine: ``bench openai``'s turn budgets vary by seed,
and a ``--device``, ``--preset`` or ``--attention`` the machine or the engine cannot take is
refused with one line naming the option, before anything starts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from commands.cli import app
from relayrl.devices import cuda_unavailable_reason
from services.rollout.openai_bench import turn_budgets


def test_turn_budgets_vary_within_a_quarter_of_the_cap_to_the_cap_and_are_fixed_by_the_seed() -> None:
    budgets = turn_budgets(episodes=16, turns=3, max_tokens=32, seed=0)

    flat = [budget for episode in budgets for budget in episode]
    assert len(budgets) == 16 and all(len(episode) == 3 for episode in budgets)
    assert all(8 <= budget <= 32 for budget in flat)
    # Turns of one wave (every episode's first turn) end at different steps, not all at the cap.
    assert len({episode[0] for episode in budgets}) > 4
    assert budgets == turn_budgets(16, 3, 32, seed=0)
    assert budgets != turn_budgets(16, 3, 32, seed=1)


no_gpu = pytest.mark.skipif(cuda_unavailable_reason() is None, reason="this machine has a GPU")


@no_gpu
@pytest.mark.parametrize("bench", ["engine", "rollout", "openai", "sampling", "logprobs"])
def test_device_cuda_without_a_gpu_is_refused_naming_the_option(bench: str) -> None:
    result = CliRunner().invoke(app, ["bench", bench, "--device", "cuda"])

    assert result.exit_code == 2
    assert "--device" in result.output and "cuda" in result.output


@pytest.mark.parametrize("bench", ["rollout", "openai"])
def test_an_unknown_device_is_refused_naming_the_option(bench: str) -> None:
    result = CliRunner().invoke(app, ["bench", bench, "--device", "tpu"])

    assert result.exit_code == 2
    assert "--device" in result.output and "tpu" in result.output


def test_bench_openai_takes_the_base_preset_only_on_cuda() -> None:
    result = CliRunner().invoke(app, ["bench", "openai", "--preset", "base"])

    assert result.exit_code == 2
    assert "--preset" in result.output and "base" in result.output


@pytest.mark.parametrize("attention", ["sdpa", "torch_native,torch_native", "auto,torch_native", ""])
def test_bench_engine_refuses_an_attention_list_it_cannot_run(attention: str) -> None:
    result = CliRunner().invoke(app, ["bench", "engine", "--attention", attention])

    assert result.exit_code == 2
    assert "--attention" in result.output


def test_bench_sampling_on_a_cpu_times_pytorch_and_names_why_triton_was_skipped() -> None:
    result = CliRunner().invoke(
        app, ["bench", "sampling", "--vocab", "1000", "--batch", "1,8", "--calls", "2", "--rounds", "1"]
    )

    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert set(figures["batches"]) == {"1", "8"} and all(row["pytorch_ms"] > 0 for row in figures["batches"].values())
    assert "RELAYRL_ENGINE_SAMPLING_BACKEND=triton" in figures["skipped"]["triton"]
