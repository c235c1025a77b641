"""The triton sampler on the GPU (auto's choice there) draws as the torch sampler does: on bfloat16
logits of Qwen's vocabulary the same log-probs and greedy tokens, and draws that follow
softmax(logits / temperature). The CPU tests check the same in Triton's interpreter on small
vocabularies; here the kernel runs compiled, on the tile sizes and dtype serving uses.

Run with ``make test-gpu``; skipped without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from services.engine.sampling import SamplingConfig, sampler_named
from tests.unit.engine.triton_sampling_checks import CHI2_5_999, _chi_square

pytestmark = pytest.mark.gpu

VOCAB = 151936


def test_log_probs_and_greedy_tokens_are_the_torch_samplers() -> None:
    sample = sampler_named("triton", torch.device("cuda")).sample
    generator = torch.Generator(device="cuda").manual_seed(0)
    logits_BV = (torch.randn((64, VOCAB), device="cuda", generator=generator) * 3).bfloat16()
    configs = [SamplingConfig(temperature=t) for t in (1.0, 0.7, 0.0, 1.3) * 16]

    tokens_B, logprobs_B = sample(logits_BV, configs, generator)

    temperature_B1 = torch.tensor([[c.temperature if not c.greedy else 1.0] for c in configs], device="cuda")
    expected_BV = torch.log_softmax(logits_BV.float() / temperature_B1, dim=-1)
    torch.testing.assert_close(logprobs_B, expected_BV.gather(1, tokens_B[:, None])[:, 0], atol=1e-4, rtol=1e-4)
    greedy = torch.tensor([c.greedy for c in configs], device="cuda")
    assert torch.equal(tokens_B[greedy], logits_BV.float().argmax(-1)[greedy])


def test_draws_follow_softmax_of_the_logits_over_temperature() -> None:
    sample = sampler_named("triton", torch.device("cuda")).sample
    generator = torch.Generator(device="cuda").manual_seed(1)
    logits_V = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, 1.5], device="cuda")
    rows = 20000
    for temperature in (1.0, 0.5):
        tokens_B, _ = sample(logits_V.repeat(rows, 1), [SamplingConfig(temperature=temperature)] * rows, generator)
        assert _chi_square(tokens_B.cpu(), torch.softmax(logits_V.double().cpu() / temperature, -1)) < CHI2_5_999
    assert _chi_square(tokens_B.cpu(), torch.softmax(logits_V.double().cpu(), -1)) > CHI2_5_999
