"""The scheduler's prefill budget (``max_prefill_tokens``): what one step may prefill, and that the
answers do not depend on it."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.engine.model_runner import ModelRunner
from services.engine.prefix_cache import BLOCK_TOKENS
from services.engine.sampling import SamplingConfig
from services.engine.scheduler import Scheduler, Sequence, stack_rows
from tests.unit.engine.models import random_causal_lm

NEW_TOKENS = 3


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return random_causal_lm()


class Engine:
    """A scheduler on its own thread, recording the prompt tokens each step prefilled."""

    def __init__(self, model: torch.nn.Module, max_prefill_tokens: int, runner: ModelRunner | None = None) -> None:
        self.runner = runner or ModelRunner(model, prefix_cache_bytes=1 << 20)
        self.prefilled_per_step: list[int] = []
        self.scheduler = Scheduler(
            runner=self.runner,
            decode_text=lambda ids: "",
            eos_token_ids=set(),
            max_running_requests=64,
            max_prefill_tokens=max_prefill_tokens,
            context_length=256,
            weight_version="0",
            seed=0,
            on_step=self._on_step,
        )
        self._counted = self.runner.counts.prefill_tokens  # a shared runner has counted earlier engines' steps

    def _on_step(self, scheduler: Scheduler) -> None:
        total = scheduler.runner.counts.prefill_tokens
        if total > self._counted:
            self.prefilled_per_step.append(total - self._counted)
        self._counted = total

    async def generate(self, prompts: list[list[int]], n: int = 1) -> list[list[int]]:
        """Greedy answers of ``n`` samples of each prompt, every request waiting before the first step."""
        loop = asyncio.get_running_loop()
        sequences = [
            Sequence(
                rid=f"r{i}-{j}",
                parent_rid=f"r{i}",
                prompt_ids=list(prompt),
                config=SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True),
                return_logprob=False,
                loop=loop,
                future=loop.create_future(),
            )
            for i, prompt in enumerate(prompts)
            for j in range(n)
        ]
        self.scheduler.submit(sequences)
        self.scheduler.start()
        try:
            bodies = await asyncio.wait_for(asyncio.gather(*(s.future for s in sequences)), timeout=60)
        finally:
            self.scheduler.stop()
        return [body["output_ids"] for body in bodies]


def prompts_of(lengths: list[int]) -> list[list[int]]:
    return [[(7 * i + t) % 97 for t in range(length)] for i, length in enumerate(lengths)]


async def test_a_step_prefills_at_most_the_budget_and_the_answers_do_not_change(model: torch.nn.Module) -> None:
    prompts = prompts_of([10, 12, 9, 11, 10, 8])
    unlimited = Engine(model, max_prefill_tokens=10_000)
    limited = Engine(model, max_prefill_tokens=24)

    expected = await unlimited.generate(prompts)
    got = await limited.generate(prompts)

    assert got == expected
    assert unlimited.prefilled_per_step == [60], "without a binding budget every prompt joins the first step"
    assert limited.prefilled_per_step == [22, 20, 18]
    assert all(tokens <= 24 for tokens in limited.prefilled_per_step)


async def test_a_prompt_longer_than_the_budget_is_prefilled_alone(model: torch.nn.Module) -> None:
    engine = Engine(model, max_prefill_tokens=8)

    got = await engine.generate(prompts_of([30, 5, 6]))

    assert [len(ids) for ids in got] == [NEW_TOKENS] * 3
    assert engine.prefilled_per_step == [30, 5, 6]


async def test_the_samples_of_one_prompt_cost_its_tokens_once(model: torch.nn.Module) -> None:
    engine = Engine(model, max_prefill_tokens=20)

    got = await engine.generate(prompts_of([20, 20]), n=8)

    assert len(got) == 16
    assert engine.prefilled_per_step == [20, 20], "eight samples of a 20-token prompt fit a budget of 20"


async def test_a_continued_conversation_costs_only_the_tokens_the_prefix_cache_does_not_give(
    model: torch.nn.Module,
) -> None:
    first_turns = prompts_of([2 * BLOCK_TOKENS] * 4)
    warm = Engine(model, max_prefill_tokens=10_000)
    answers = await warm.generate(first_turns)
    # Each next turn: the conversation so far and 4 new tokens. The cache holds what each first turn
    # fed the model (its prompt and all but its last answer token), so 1 + 4 tokens are new.
    next_turns = [turn + answer + [1, 2, 3, 4] for turn, answer in zip(first_turns, answers, strict=True)]
    engine = Engine(model, max_prefill_tokens=20, runner=warm.runner)  # its prefix cache holds the first turns

    got = await engine.generate(next_turns)

    assert len(got) == 4
    assert engine.prefilled_per_step == [4 * (1 + 4)], "four continuations of 5 new tokens fit a budget of 20"


def test_a_step_samples_every_sequence_from_its_own_row_of_its_pass() -> None:
    decoded, prefilled = torch.randn(4, 8), torch.randn(2, 8)
    rows = [(decoded, 0), (decoded, 1), (decoded, 3), (prefilled, 1), (prefilled, 0), (prefilled, 0)]

    stacked = stack_rows(rows)

    torch.testing.assert_close(stacked, torch.stack([tensor[row] for tensor, row in rows]), rtol=0, atol=0)
    # After a decode step every row is its pass's own, in order: sampled from the pass's tensor, not a copy.
    assert stack_rows([(decoded, row) for row in range(4)]).data_ptr() == decoded.data_ptr()
