"""Choosing the next token and its log-prob, as SGLang's sampler does.

Log-probs are taken **after** temperature scaling and **before** top-p / top-k truncation:
``log_softmax(logits / temperature)[token]``. That is SGLang's default (its
``SGLANG_RETURN_ORIGINAL_LOGPROB`` switch, off by default, would return them before
temperature), and it is what verl's trainer recomputes (logits divided by the rollout
temperature), so behaviour and training log-probs agree. Greedy decoding (temperature 0)
reports ``log_softmax(logits)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from relayrl.devices import upload

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


def sample_batch(
    logits_BV: torch.Tensor, configs: Sequence[SamplingConfig], generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's next token and its log-prob (see the module docstring for which log-prob), as two
    ``[B]`` tensors on the logits' device (``generator``'s too).

    One pass for the whole batch, whatever mix of settings its rows carry: a step's sampling costs a
    handful of kernels, not a handful per row, which on a GPU would cost more than the decode pass.
    Per row, the result is what sampling that row alone gives: greedy rows take the argmax; top-k
    keeps the probabilities at least the k-th largest; top-p the smallest prefix (by probability)
    whose mass reaches ``top_p`` of what top-k left; the token is drawn from what remains.
    """
    vocab = logits_BV.shape[1]
    device = logits_BV.device
    greedy = [c.greedy for c in configs]
    temperature_B1 = upload(torch.tensor([[1.0 if c.greedy else c.temperature] for c in configs]), device)
    logprobs_BV = torch.log_softmax(logits_BV.float() / temperature_B1, dim=-1)
    if all(greedy):
        tokens_B = torch.argmax(logprobs_BV, dim=-1)
        return tokens_B, logprobs_BV.gather(1, tokens_B[:, None])[:, 0]
    probs_BV = logprobs_BV.exp()
    top_k = [c.top_k if 0 < c.top_k < vocab else vocab for c in configs]
    if min(top_k) < vocab:
        # Rows without top-k compare against 0 and keep every token.
        kth_BK = torch.topk(probs_BV, max(k for k in top_k if k < vocab), dim=-1).values
        index_B1 = upload(torch.tensor([[min(k, kth_BK.shape[1]) - 1] for k in top_k]), device)
        limited_B1 = upload(torch.tensor([[k < vocab] for k in top_k]), device)
        kth_B1 = torch.where(limited_B1, kth_BK.gather(1, index_B1), 0.0)
        probs_BV = torch.where(probs_BV >= kth_B1, probs_BV, 0.0)
    if any(c.top_p < 1.0 for c in configs):
        top_p_B1 = upload(torch.tensor([[c.top_p] for c in configs]), device)
        sorted_BV, order_BV = torch.sort(probs_BV, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays); rows at
        # top_p 1 keep everything, whatever the rounding of a cumulative sum.
        outside_BV = (torch.cumsum(sorted_BV, dim=-1) - sorted_BV) > top_p_B1 * sorted_BV.sum(-1, keepdim=True)
        outside_BV &= top_p_B1 < 1.0
        probs_BV = torch.zeros_like(probs_BV).scatter(1, order_BV, sorted_BV.masked_fill(outside_BV, 0.0))
    # torch.multinomial's own draw for one sample (the argmax of p / q, q ~ Exp(1)), the same tokens
    # for the same generator, without its checks of the probabilities: each reads a value back from
    # the device, so the host would wait there for every pass in flight.
    noise_BV = torch.empty_like(probs_BV).exponential_(1, generator=generator)
    tokens_B = (probs_BV / noise_BV).argmax(dim=-1)
    if any(greedy):
        tokens_B = torch.where(upload(torch.tensor(greedy), device), torch.argmax(logprobs_BV, dim=-1), tokens_B)
    return tokens_B, logprobs_BV.gather(1, tokens_B[:, None])[:, 0]


SampleFn = Callable[[torch.Tensor, Sequence[SamplingConfig], torch.Generator], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True, slots=True)
class Sampler:
    """A sampling backend (``sampling_backend``): its name, its :func:`sample_batch`, and whether it
    builds a kernel at first use."""

    name: str
    sample: SampleFn
    compiles: bool = False

    def warm_up(self, vocab: int, dtype: torch.dtype, device: torch.device) -> None:
        """Draws once from a throwaway generator, so a kernel built at first use (Triton's) is built
        at start, not under the first requests; the engine's own generator is left as it was."""
        if not self.compiles:
            return
        throwaway = torch.Generator(device=device).manual_seed(0)
        self.sample(torch.zeros((1, vocab), dtype=dtype, device=device), [SamplingConfig()], throwaway)


def sampler_named(name: str, device: torch.device) -> Sampler:
    """The sampling backend ``name`` (``pytorch`` or ``triton``), or one line naming the setting where
    it cannot run."""
    if name == "pytorch":
        return Sampler("pytorch", sample_batch)
    if name != "triton":
        raise ValueError(f"unknown sampling backend {name!r}; choose pytorch or triton")
    from relayrl.config import SettingsError

    def refused(why: str) -> SettingsError:
        return SettingsError("EngineSettings", [f"RELAYRL_ENGINE_SAMPLING_BACKEND=triton: {why}"])

    try:
        from services.engine.triton_attention import interpreted
        from services.engine.triton_sampling import sample_plain
    except ImportError as exc:
        raise refused(f"Triton is not installed ({exc}); choose pytorch") from None
    if device.type != "cuda" and not interpreted():
        raise refused(f"Triton kernels run on CUDA, not {device.type}; choose pytorch")

    def sample(
        logits_BV: torch.Tensor, configs: Sequence[SamplingConfig], generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Top-k and top-p need each row's sorted distribution, which the kernel does not build.
        vocab = logits_BV.shape[1]
        if any(c.top_p < 1.0 or 0 < c.top_k < vocab for c in configs):
            return sample_batch(logits_BV, configs, generator)
        scales = [1.0 if c.greedy else 1.0 / c.temperature for c in configs]
        return sample_plain(logits_BV, scales, [c.greedy for c in configs], generator)

    return Sampler("triton", sample, compiles=True)
