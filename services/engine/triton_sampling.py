"""A Triton kernel that samples every row of a step in one read of its logits.

The torch sampler (:func:`services.engine.sampling.sample_batch`) makes about eight passes over the
step's ``[B, V]`` logits in float32 (upcast, temperature, log-softmax, exp, noise, division, argmax);
at 256 rows of Qwen's 151,936-token vocabulary each pass moves 155 MB. This kernel reads each row
once, in the dtype the model gave: one program per row keeps an online log-sum-exp of
``logits / temperature`` (for the token's log-prob, taken as the torch sampler takes it) and, in
the same loop, the Gumbel-max draw: the argmax of ``logits / temperature + Gumbel noise``, which
draws from ``softmax(logits / temperature)`` as torch.multinomial's argmax of ``p / Exp(1)`` does.
The noise is Philox's, made in the kernel from a seed the engine's generator gives each step, so
runs with one seed repeat. Greedy rows take the argmax of the logits.

Top-k and top-p need each row's sorted distribution: :func:`services.engine.sampling.sampler_named`
sends a batch with such a row to the torch sampler whole. On a CPU, Triton runs kernels only in
its interpreter (``TRITON_INTERPRET=1``, set before Triton is imported), where the tests check
this one; the engine takes it on CUDA.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from relayrl.devices import upload

# Vocabulary entries a program reads per loop step (at most), as four quarters: Philox makes four
# numbers per call, one for each quarter, so the noise costs a quarter of the calls one number each would.
BLOCK_V = 4096


@triton.jit
def _take_quarter(
    base,
    scale,
    greedy,
    uniform,
    first_col,
    running_max,
    total,
    best,
    best_col,
    VOCAB: tl.constexpr,
    QUARTER: tl.constexpr,
):
    cols = first_col + tl.arange(0, QUARTER)
    inside = cols < VOCAB
    x = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32) * scale
    new_max = tl.maximum(running_max, tl.max(x, axis=0))
    # Until a finite logit is seen the sum stays 0 (not exp(-inf - -inf), which is NaN).
    seen = new_max > float("-inf")
    total = tl.where(seen, total * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0), 0.0)
    key = tl.where(greedy, x, x - tl.log(-tl.log(uniform)))
    key = tl.where(inside, key, float("-inf"))
    quarter_best = tl.max(key, axis=0)
    quarter_col = tl.argmax(key, axis=0) + first_col
    # Strictly greater: the first of equal values wins, as torch.argmax's does.
    better = quarter_best > best
    return new_max, total, tl.where(better, quarter_best, best), tl.where(better, quarter_col, best_col)


@triton.jit
def _sample_rows(
    logits_ptr,
    stride_b,
    scale_ptr,
    greedy_ptr,
    seed_ptr,
    tokens_ptr,
    logprobs_ptr,
    VOCAB: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    quarter: tl.constexpr = BLOCK_V // 4
    scale = tl.load(scale_ptr + row)
    greedy = tl.load(greedy_ptr + row) != 0
    seed = tl.load(seed_ptr)
    base = logits_ptr + row.to(tl.int64) * stride_b
    # Each row draws its noise from offsets of its own.
    first_offset = row * (tl.cdiv(VOCAB, BLOCK_V) * quarter)
    running_max = tl.full([], float("-inf"), tl.float32)
    total = tl.full([], 0.0, tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    best_col = tl.full([], 0, tl.int32)
    for start in range(0, VOCAB, BLOCK_V):
        u0, u1, u2, u3 = tl.rand4x(seed, first_offset + start // 4 + tl.arange(0, quarter))
        running_max, total, best, best_col = _take_quarter(
            base, scale, greedy, u0, start, running_max, total, best, best_col, VOCAB, quarter
        )
        running_max, total, best, best_col = _take_quarter(
            base, scale, greedy, u1, start + quarter, running_max, total, best, best_col, VOCAB, quarter
        )
        running_max, total, best, best_col = _take_quarter(
            base, scale, greedy, u2, start + 2 * quarter, running_max, total, best, best_col, VOCAB, quarter
        )
        running_max, total, best, best_col = _take_quarter(
            base, scale, greedy, u3, start + 3 * quarter, running_max, total, best, best_col, VOCAB, quarter
        )
    chosen = tl.load(base + best_col).to(tl.float32) * scale
    tl.store(tokens_ptr + row, best_col.to(tl.int64))
    tl.store(logprobs_ptr + row, chosen - (running_max + tl.log(total)))


def sample_plain(
    logits_BV: torch.Tensor, scales: Sequence[float], greedy: Sequence[bool], generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's token and its log-prob under ``softmax(logits * scale)``, as two ``[B]`` tensors
    on the logits' device: drawn (Gumbel-max), or the argmax where ``greedy``. ``scales`` are the
    rows' 1 / temperature (1 for greedy rows); none asks for top-k or top-p."""
    batch, vocab = logits_BV.shape
    device = logits_BV.device
    if logits_BV.stride(1) != 1:
        logits_BV = logits_BV.contiguous()
    scale_B = upload(torch.tensor(list(scales), dtype=torch.float32), device)
    greedy_B = upload(torch.tensor(list(greedy), dtype=torch.int8), device)
    seed = torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device, generator=generator)
    tokens_B = torch.empty(batch, dtype=torch.int64, device=device)
    logprobs_B = torch.empty(batch, dtype=torch.float32, device=device)
    _sample_rows[(batch,)](
        logits_BV,
        logits_BV.stride(0),
        scale_B,
        greedy_B,
        seed,
        tokens_B,
        logprobs_B,
        VOCAB=vocab,
        BLOCK_V=min(BLOCK_V, max(64, triton.next_power_of_2(vocab))),
        num_warps=8,
    )
    return tokens_B, logprobs_B
