from __future__ import annotations

import pytest
import torch

from services.engine.sampling import SamplingConfig, sample_batch
from services.engine.scheduler import version_spans


def sample(logits_V: torch.Tensor, config: SamplingConfig, generator: torch.Generator) -> tuple[int, float]:
    tokens, logprobs = sample_batch(logits_V[None], [config], generator)
    return int(tokens[0]), float(logprobs[0])


def test_logprob_is_after_temperature_and_before_truncation() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    gen = torch.Generator().manual_seed(0)
    token, logprob = sample(logits, SamplingConfig(temperature=0.5, top_k=1), gen)
    assert token == 0
    assert logprob == pytest.approx(float(torch.log_softmax(logits / 0.5, -1)[0]))
    assert logprob < 0  # not renormalised over the single top-k token


def test_greedy_reports_untempered_logprobs() -> None:
    logits = torch.tensor([0.0, 3.0, 1.0])
    token, logprob = sample(logits, SamplingConfig(temperature=0.0), torch.Generator())
    assert token == 1 and logprob == pytest.approx(float(torch.log_softmax(logits, -1)[1]))


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.log(torch.tensor([0.6, 0.3, 0.05, 0.05]))
    gen = torch.Generator().manual_seed(1)
    tokens = {sample(logits, SamplingConfig(top_p=0.8), gen)[0] for _ in range(200)}
    assert tokens == {0, 1}


def test_each_row_of_a_batch_is_sampled_with_its_own_settings() -> None:
    """One pass over rows of every kind gives each row what it alone would get: the same draws
    per row as its settings allow, and its own log-prob."""
    probs = torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04])
    logits = torch.log(probs)
    configs = [
        SamplingConfig(temperature=0.0),
        SamplingConfig(temperature=2.0, top_k=2),
        SamplingConfig(top_p=0.65),
        SamplingConfig(),
        SamplingConfig(top_k=3, top_p=0.5),
    ]
    gen = torch.Generator().manual_seed(3)
    draws = 4000
    seen: list[list[int]] = [[] for _ in configs]
    for _ in range(draws):
        tokens, logprobs = sample_batch(logits.expand(len(configs), -1), configs, gen)
        for row, token in enumerate(tokens.tolist()):
            seen[row].append(token)
            temperature = configs[row].temperature or 1.0
            expected = torch.log_softmax(logits / temperature, -1)[token]
            assert float(logprobs[row]) == pytest.approx(float(expected))

    assert set(seen[0]) == {0}
    assert set(seen[1]) == {0, 1}
    assert set(seen[2]) == {0, 1}  # 0.4 + 0.3 reaches 0.65; 0.4 alone does not
    assert set(seen[3]) == {0, 1, 2, 3, 4}
    assert set(seen[4]) == {0, 1}  # top-k leaves 0.9 of the mass; top-p 0.5 of that needs two tokens
    # The untruncated row draws as the distribution says (five standard errors).
    for token, p in enumerate(probs.tolist()):
        share = seen[3].count(token) / draws
        assert abs(share - p) < 5 * (p * (1 - p) / draws) ** 0.5
    # The top-p row renormalises over its nucleus: 0.4 against 0.3.
    share = seen[2].count(0) / draws
    assert abs(share - 4 / 7) < 5 * ((4 / 7) * (3 / 7) / draws) ** 0.5


@pytest.mark.parametrize(
    "kwargs", [{"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": 0}, {"max_new_tokens": -1}]
)
def test_bad_sampling_values_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)


def test_version_spans_follow_sglang_shape() -> None:
    assert version_spans(["1", "1", "2"], "2") == [
        {"version": "1", "start": 0, "end": 2},
        {"version": "2", "start": 2, "end": 3},
    ]
    assert version_spans([], "5") == [{"version": "5", "start": 0, "end": 0}]
