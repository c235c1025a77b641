"""The paged KV cache gives every row the logits of a lone forward pass, whatever joins or leaves,
with either attention backend (triton's in ``test_triton.py``), and gives every block back."""

from __future__ import annotations

import pytest
import torch

from services.engine.kv_pool import BlockPool, KVLayout
from services.engine.model_runner import ModelRunner, Slot
from tests.unit.engine.models import random_causal_lm


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    return random_causal_lm(request.param)


@pytest.fixture(params=["torch_native", "flex_attention"])
def attention(request: pytest.FixtureRequest) -> str:
    return request.param


def runner_of(
    model: torch.nn.Module, attention: str = "torch_native", cache_bytes: int = 0, **pool: int
) -> ModelRunner:
    """A runner over a pool of 4-token blocks (small, so sequences cross block boundaries often)."""
    blocks = BlockPool(KVLayout.of(model), pool.get("block_size", 4), pool.get("max_blocks", 512), initial_blocks=4)
    return ModelRunner(model, pool=blocks, prefix_cache_bytes=cache_bytes, attention=attention)


@torch.inference_mode()
def lone_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


class Running:
    """Sequences driven through a runner the way the scheduler drives them (greedy tokens)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.ids: list[list[int]] = []
        self.slots: list[Slot] = []
        self.logits: list[torch.Tensor] = []

    def join(self, prompts: list[list[int]]) -> list[int]:
        """Prefills ``prompts``; returns how many tokens of each the prefix cache gave."""
        prefilled = self.runner.prefill(prompts)
        for prompt, done in zip(prompts, prefilled, strict=True):
            self.ids.append(list(prompt))
            self.slots.append(done.slot)
            self.logits.append(done.logits)
        return [done.cached_tokens for done in prefilled]

    def first_turn(self, prompt: list[int], steps: int) -> list[int]:
        """A whole sequence on its own: joins, decodes ``steps`` tokens, finishes; returns its ids."""
        self.join([prompt])
        for _ in range(steps):
            self.step()
        return self.finish(len(self.ids) - 1)

    def finish(self, index: int) -> list[int]:
        """Ends sequence ``index`` as the scheduler does (its keys and values kept); returns its ids."""
        ids = self.ids[index]
        self.runner.remember(self.slots[index], ids, None)
        self.leave(index)
        return ids

    def leave(self, index: int) -> None:
        assert index < len(self.slots)
        self.runner.kv.release(self.slots.pop(index))
        self.ids.pop(index)
        self.logits.pop(index)

    def step(self) -> None:
        tokens = [int(torch.argmax(logits)) for logits in self.logits]
        for ids, token in zip(self.ids, tokens, strict=True):
            ids.append(token)
        self.logits = list(self.runner.decode(self.slots, tokens))

    def assert_lone(self, model: torch.nn.Module) -> None:
        for ids, logits in zip(self.ids, self.logits, strict=True):
            torch.testing.assert_close(logits, lone_logits(model, ids), atol=1e-4, rtol=1e-4)


def test_rows_of_different_lengths_match_lone_passes(model: torch.nn.Module, attention: str) -> None:
    running = Running(runner_of(model, attention))
    running.join([[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19]])
    running.assert_lone(model)
    for _ in range(6):
        running.step()
        running.assert_lone(model)


def test_sequences_joining_and_leaving_mid_decode_keep_their_logits(model: torch.nn.Module) -> None:
    running = Running(runner_of(model))
    running.join([[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]])
    for _ in range(3):
        running.step()
    running.join([[20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]])  # one shorter, one longer
    running.step()
    running.assert_lone(model)
    running.leave(0)  # its blocks go back to the pool; nobody else's move
    running.step()
    running.assert_lone(model)
    running.leave(2)
    running.leave(0)
    running.step()
    running.step()
    running.assert_lone(model)
    assert len(running.runner.kv) == 1


def test_sequences_take_blocks_as_they_grow_and_give_every_one_back(model: torch.nn.Module) -> None:
    runner = runner_of(model, block_size=4)
    running = Running(runner)
    running.join([[3, 4, 5], [6]])
    assert runner.pool.used_blocks == 2
    for _ in range(6):
        running.step()
    running.assert_lone(model)
    # 9 and 7 tokens held: three and two blocks of 4 tokens.
    assert [len(slot.blocks) for slot in running.slots] == [3, 2]
    assert runner.pool.used_blocks == 5
    assert runner.pool.growths >= 1  # the CPU pool started at 4 blocks and claimed more as needed
    running.leave(0)
    running.join([[7, 8, 9, 10]])
    running.step()
    running.assert_lone(model)
    running.leave(0)
    running.leave(0)
    assert len(runner.kv) == 0 and runner.pool.used_blocks == 0


def test_a_full_pool_refuses_a_block_and_takes_none(model: torch.nn.Module) -> None:
    from services.engine.kv_pool import OutOfBlocks

    runner = runner_of(model, block_size=4, max_blocks=4)  # three usable blocks: 12 tokens
    running = Running(runner)
    running.join([list(range(1, 11))])
    with pytest.raises(OutOfBlocks):
        runner.prefill([[20, 21, 22, 23, 24, 25]])  # needs two blocks, one is free
    assert runner.pool.used_blocks == 3 and len(runner.kv) == 1
    running.step()
    running.step()
    running.assert_lone(model)


def test_a_prompt_continuing_a_finished_sequence_feeds_only_its_new_tokens(model: torch.nn.Module) -> None:
    runner = runner_of(model, cache_bytes=1 << 20)
    running = Running(runner)
    earlier = running.first_turn(list(range(1, 40)), steps=5)  # 39 prompt tokens and 5 generated
    fed = runner.counts.prefill_tokens
    observation = [50, 51, 52]
    diverging = [*earlier[:37], 90, 91]  # shares 37 tokens, past the last whole block (32)
    cached = running.join([earlier + observation, [7, 8, 9], diverging, earlier[:30]])
    # At most all but the last prompt token comes from the cache: that one is fed for its logits.
    assert cached == [len(earlier), 0, 37, 29]
    assert runner.counts.prefill_tokens - fed == len(observation) + 3 + 2 + 1
    assert runner.counts.cached_tokens == sum(cached)
    running.assert_lone(model)
    for _ in range(3):
        running.step()
        running.assert_lone(model)
    # Whole blocks are shared, one reference per holder: the cache entry and the three prompts
    # starting with its first block (the continuation, the diverging one and the shorter one).
    shared = running.slots[0].blocks[0]
    assert [running.slots[i].blocks[0] for i in (2, 3)] == [shared, shared]
    assert runner.pool.refs[shared] == 4
    for index in reversed(range(len(running.slots))):
        running.leave(index)
    runner.prefixes.clear()
    assert runner.pool.used_blocks == 0


def test_nothing_is_reused_after_a_clear_or_under_another_adapter(model: torch.nn.Module) -> None:
    runner = runner_of(model, cache_bytes=1 << 20)
    running = Running(runner)
    earlier = running.first_turn(list(range(1, 30)), steps=1)
    assert runner.prefixes.lookup([*earlier, 5], object()) is None  # keys and values of the base, not an adapter's
    runner.prefixes.clear()  # the engine's weights changed
    assert running.join([[*earlier, 5]]) == [0]
    running.assert_lone(model)


def test_a_runner_without_a_cache_budget_keeps_nothing(model: torch.nn.Module) -> None:
    runner = runner_of(model)
    running = Running(runner)
    earlier = running.first_turn(list(range(1, 30)), steps=0)
    assert running.join([[*earlier, 5]]) == [0]
    assert len(runner.prefixes) == 0


def test_a_forked_row_continues_as_its_original(model: torch.nn.Module, attention: str) -> None:
    running = Running(runner_of(model, attention))
    running.join([[3, 1, 4, 1, 5, 9, 2, 6]])
    running.slots.append(running.runner.kv.fork(running.slots[0]))  # a second sample of the prompt
    running.ids.append(list(running.ids[0]))
    running.logits.append(running.logits[0])
    for _ in range(3):
        running.step()
        running.assert_lone(model)
    torch.testing.assert_close(running.logits[0], running.logits[1])
    # Eight prompt tokens are two whole 4-token blocks, which the fork shares rather than copies.
    first, second = (slot.blocks for slot in running.slots)
    assert first[:2] == second[:2] and first[2:] != second[2:]


def test_the_start_up_warm_up_leaves_no_row_block_count_or_cached_prefix_and_changes_no_answer(
    model: torch.nn.Module, attention: str
) -> None:
    runner = runner_of(model, attention, cache_bytes=1 << 20)
    prompt = [5, 9, 2, 7, 7, 3]

    # Six shape classes: one row and two, by queries of 1, 2 and more than one flex query block.
    assert runner.warm_up(context_length=512) == 6

    assert runner.pool.used_blocks == 0 and len(runner.kv) == 0
    assert runner.counts.total == 0 and runner.counts.prefill_tokens == 0
    assert runner.prefixes.lookup(prompt, None) is None
    prefilled = runner.prefill([prompt])
    torch.testing.assert_close(prefilled[0].logits, lone_logits(model, prompt), rtol=1e-5, atol=1e-5)
    assert prefilled[0].cached_tokens == 0
