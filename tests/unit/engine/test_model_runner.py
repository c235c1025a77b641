"""The batched KV layout gives every row the logits of a lone forward pass, whatever joins or leaves."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from services.engine.model_runner import ModelRunner, Slot


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    config_class = Qwen2Config if request.param == "qwen2" else LlamaConfig
    config = config_class(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


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

    def join(self, prompts: list[list[int]]) -> None:
        for prompt, (cache, logits) in zip(prompts, self.runner.prefill(prompts), strict=True):
            self.ids.append(list(prompt))
            self.slots.append(self.runner.kv.insert(cache))
            self.logits.append(logits)

    def leave(self, index: int) -> None:
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


def test_rows_of_different_lengths_match_lone_passes(model: torch.nn.Module) -> None:
    running = Running(ModelRunner(model))
    running.join([[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19]])
    running.assert_lone(model)
    for _ in range(6):
        running.step()
        running.assert_lone(model)


def test_sequences_joining_and_leaving_mid_decode_keep_their_logits(model: torch.nn.Module) -> None:
    running = Running(ModelRunner(model))
    running.join([[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]])
    for _ in range(3):
        running.step()
    running.join([[20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]])  # one shorter, one longer
    running.step()
    running.assert_lone(model)
    running.leave(0)  # the last row moves into the freed one
    running.step()
    running.assert_lone(model)
    running.leave(2)  # the last row leaves: nothing moves
    running.leave(0)
    running.step()
    running.step()
    running.assert_lone(model)
    assert len(running.runner.kv) == 1


def test_growing_past_capacity_chunks_reallocates_once_per_chunk(model: torch.nn.Module) -> None:
    runner = ModelRunner(model, chunk=8)
    running = Running(runner)
    running.join([[3, 4, 5], [6]])
    joined = runner.kv.reallocations
    for _ in range(20):
        running.step()
    running.assert_lone(model)
    assert runner.kv.capacity == 24  # 23 tokens in the longest row, rounded up to the chunk
    # Capacity 8 -> 16 -> 24 over 20 steps: two reallocations, not one per step.
    assert runner.kv.reallocations - joined == 2
    running.leave(0)  # rows move inside buffers that decode grew
    running.join([[7, 8, 9, 10]])
    running.step()
    running.assert_lone(model)


def test_decode_refuses_a_subset_of_the_running_rows(model: torch.nn.Module) -> None:
    running = Running(ModelRunner(model))
    running.join([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="every running row"):
        running.runner.decode(running.slots[:1], [5])


def test_an_idle_runner_releases_its_cache_memory(model: torch.nn.Module) -> None:
    running = Running(ModelRunner(model))
    running.join([[1, 2, 3]])
    running.step()
    running.leave(0)
    assert running.runner.kv.capacity == 0
    running.join([[4, 5]])
    running.step()
    running.assert_lone(model)
