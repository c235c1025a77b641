"""Choosing the next token and its log-prob, as SGLang's sampler does.

Log-probs are taken **after** temperature scaling and **before** top-p / top-k truncation:
``log_softmax(logits / temperature)[token]``. That is SGLang's default (its
``SGLANG_RETURN_ORIGINAL_LOGPROB`` switch, off by default, would return them before
temperature), and it is what verl's trainer recomputes (logits divided by the rollout
temperature), so behaviour and training log-probs agree. Greedy decoding (temperature 0)
reports ``log_softmax(logits)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# SGLang treats temperatures below this as greedy.
_GREEDY_BELOW = 1e-6


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_BELOW


def scaled_logprobs(logits_V: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs of the distribution the engine samples from, before top-p/top-k."""
    logits_V = logits_V.float()
    if temperature >= _GREEDY_BELOW:
        logits_V = logits_V / temperature
    return torch.log_softmax(logits_V, dim=-1)


def sample(logits_V: torch.Tensor, config: SamplingConfig, generator: torch.Generator) -> tuple[int, float]:
    """The next token id and its log-prob (see the module docstring for which log-prob)."""
    token, logprob = sample_on_device(logits_V, config, generator)
    return int(token), float(logprob)


def sample_on_device(
    logits_V: torch.Tensor, config: SamplingConfig, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample`'s token and log-prob as 0-d tensors on the logits' device (``generator``'s too),
    so a step reads every sequence's choice back with one copy instead of one per sequence."""
    logprobs_V = scaled_logprobs(logits_V, config.temperature)
    if config.greedy:
        token = torch.argmax(logprobs_V)
        return token, logprobs_V[token]
    probs_V = logprobs_V.exp()
    if config.top_k > 0 and config.top_k < probs_V.numel():
        kth = torch.topk(probs_V, config.top_k).values[-1]
        probs_V = torch.where(probs_V >= kth, probs_V, torch.zeros_like(probs_V))
    if config.top_p < 1.0:
        sorted_V, order_V = torch.sort(probs_V, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        outside = (torch.cumsum(sorted_V, dim=-1) - sorted_V) > config.top_p * sorted_V.sum()
        sorted_V = sorted_V.masked_fill(outside, 0.0)
        probs_V = torch.zeros_like(probs_V).scatter(0, order_V, sorted_V)
    token = torch.multinomial(probs_V, 1, generator=generator)[0]
    return token, logprobs_V[token]
