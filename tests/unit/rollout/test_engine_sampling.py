from __future__ import annotations

import pytest
import torch

from services.engine.sampling import SamplingConfig, sample, scaled_logprobs
from services.engine.scheduler import version_spans


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
    assert torch.allclose(scaled_logprobs(logits, 0.0), torch.log_softmax(logits, -1))


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.log(torch.tensor([0.6, 0.3, 0.05, 0.05]))
    gen = torch.Generator().manual_seed(1)
    tokens = {sample(logits, SamplingConfig(top_p=0.8), gen)[0] for _ in range(200)}
    assert tokens == {0, 1}


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
