"""A Triton kernel for one query token per row over the paged KV cache (a decode step).

One program per (row, KV head) reads the row's pages through its block table and attends with
all the query heads that share the KV head (grouped-query attention: the keys and values are read
once per group, not once per query head), with an online softmax over tiles of ``BLOCK_N``
tokens. The loop ends at the row's own length, read on the device, so the launch has the same
shape at every step and a decode step can be replayed from a CUDA graph.

On a CPU, Triton runs its kernels only in its interpreter (``TRITON_INTERPRET=1``, set before
Triton is imported): the tests check the kernel for equality there; the engine takes the backend
on CUDA.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Tokens per tile of the loop over a row's keys; a page (16 on CPU, 128 on CUDA) holds whole tiles or one.
BLOCK_N = 64


def interpreted() -> bool:
    """Whether Triton runs its kernels in its CPU interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _paged_decode(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    tables_ptr,
    positions_ptr,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_kh,
    stride_kt,
    stride_ob,
    stride_oh,
    stride_tb,
    stride_pb,
    scale,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    group = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + group
    head_ok = group < GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q = tl.load(
        q_ptr + row * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
        mask=head_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    # The query at position p sees the row's tokens [0, p].
    seen = tl.load(positions_ptr + row * stride_pb).to(tl.int32) + 1
    best = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start in range(0, seen, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < seen
        block = tl.load(tables_ptr + row * stride_tb + pos // PAGE, mask=pos_ok, other=0)
        offsets = kv_head * stride_kh + (block * PAGE + pos % PAGE)[:, None] * stride_kt + dims[None, :]
        kv_ok = pos_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + offsets, mask=kv_ok, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        scores = tl.where(pos_ok[None, :], scores, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, 1))
        kept = tl.exp(best - new_best)
        weights = tl.exp(scores - new_best[:, None])
        total = total * kept + tl.sum(weights, 1)
        v = tl.load(v_ptr + offsets, mask=kv_ok, other=0.0)
        acc = acc * kept[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
        best = new_best
    out = acc / total[:, None]
    tl.store(
        out_ptr + row * stride_ob + heads[:, None] * stride_oh + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=head_ok[:, None] & dim_ok[None, :],
    )


def paged_decode(
    query_BH1D: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    tables_BN: torch.Tensor,
    positions_B1: torch.Tensor,
    page: int,
    scale: float,
) -> torch.Tensor:
    """Attention of each row's one query over its pages: ``[B, 1, heads, head_dim]``.

    ``keys`` and ``values`` are one layer of the pool, ``[kv_heads, tokens, head_dim]``.
    """
    batch, heads, _, head_dim = query_BH1D.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads
    out = torch.empty((batch, 1, heads, head_dim), dtype=query_BH1D.dtype, device=query_BH1D.device)
    _paged_decode[(batch, kv_heads)](
        query_BH1D,
        keys,
        values,
        out,
        tables_BN,
        positions_B1,
        query_BH1D.stride(0),
        query_BH1D.stride(1),
        query_BH1D.stride(3),
        keys.stride(0),
        keys.stride(1),
        out.stride(0),
        out.stride(2),
        tables_BN.stride(0),
        positions_B1.stride(0),
        scale,
        GROUP=group,
        # tl.dot takes blocks of at least 16 on each side.
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PAGE=page,
        BLOCK_N=BLOCK_N,
        # float32 models are compared with SDPA to the last bits; TF32 would round their products.
        PRECISION="ieee" if query_BH1D.dtype == torch.float32 else "tf32",
    )
    return out
