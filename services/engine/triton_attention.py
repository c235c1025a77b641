"""Triton kernels for one query token per row over the paged KV cache (a decode step).

One program per (row, KV head, split) reads its share of the row's pages through its block table
and attends with all the query heads that share the KV head (grouped-query attention: the keys and
values are read once per group, not once per query head), with an online softmax over tiles of
``BLOCK_N`` tokens. The loop ends at the row's own length, read on the device, so the launch has
the same shape at every step and a decode step can be replayed from a CUDA graph.

A batch of few rows is split along its keys (flash-decoding): with one program per row and KV
head, 8 rows of a long reasoning trace would keep 16 of an H200's 132 processors busy while the
step waits on the longest row. :func:`decode_splits` cuts each row into enough splits to give every
processor two programs; each split writes its output and log-sum-exp, and ``_merge_splits``
weighs them into the row's. A split past the row's end writes nothing to weigh.

On a CPU, Triton runs its kernels only in its interpreter (``TRITON_INTERPRET=1``, set before
Triton is imported): the tests check the kernels for equality there; the engine takes the backend
on CUDA.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

# Tokens per tile of the loop over a row's keys; a page (16 on CPU, 128 on CUDA) holds whole tiles or one.
BLOCK_N = 64
# Splits of a row at most: past this the merge reads more than the splits save.
MAX_SPLITS = 16


def interpreted() -> bool:
    """Whether Triton runs its kernels in its CPU interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET") == "1"


# splits is a value, not a specialisation: Triton would otherwise compile a kernel for 1, one for
# multiples of 16 and one for the rest, each at an engine's start.
@triton.jit(do_not_specialize=["splits"])
def _paged_decode(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    part_ptr,
    lse_ptr,
    tables_ptr,
    positions_ptr,
    splits,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_kh,
    stride_kt,
    stride_ob,
    stride_oh,
    stride_tb,
    stride_pb,
    stride_partb,
    stride_parth,
    stride_parts,
    stride_lseb,
    stride_lseh,
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
    split = tl.program_id(2)
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
    # The query at position p sees the row's tokens [0, p]; this split, whole tiles of them.
    seen = tl.load(positions_ptr + row * stride_pb).to(tl.int32) + 1
    per_split = tl.cdiv(tl.cdiv(seen, BLOCK_N), splits) * BLOCK_N
    first = split * per_split
    last = tl.minimum(first + per_split, seen)
    best = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start in range(first, last, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < last
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
    written = head_ok[:, None] & dim_ok[None, :]
    if splits == 1:
        out = acc / total[:, None]
        tl.store(
            out_ptr + row * stride_ob + heads[:, None] * stride_oh + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=written,
        )
    else:
        # A split past the row's end has no tokens: output 0 and log-sum-exp -inf, weighed 0 by the merge.
        part = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(
            part_ptr + row * stride_partb + heads[:, None] * stride_parth + split * stride_parts + dims[None, :],
            part,
            mask=written,
        )
        tl.store(lse_ptr + row * stride_lseb + heads * stride_lseh + split, best + tl.log(total), mask=head_ok)


@triton.jit(do_not_specialize=["splits"])
def _merge_splits(
    part_ptr,
    lse_ptr,
    out_ptr,
    splits,
    stride_partb,
    stride_parth,
    stride_parts,
    stride_lseb,
    stride_lseh,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.arange(0, BLOCK_S)
    split_ok = split < splits
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    lse = tl.load(lse_ptr + row * stride_lseb + head * stride_lseh + split, mask=split_ok, other=float("-inf"))
    # The first split always holds tokens, so the largest log-sum-exp is finite.
    weights = tl.exp(lse - tl.max(lse, 0))
    part = tl.load(
        part_ptr + row * stride_partb + head * stride_parth + split[:, None] * stride_parts + dims[None, :],
        mask=split_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    out = tl.sum(part * weights[:, None], 0) / tl.sum(weights, 0)
    tl.store(out_ptr + row * stride_ob + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty), mask=dim_ok)


@functools.cache
def _processors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def decode_splits(batch: int, kv_heads: int, device: torch.device, fixed: int = 0) -> int:
    """Splits per row for a step of ``batch`` rows: ``fixed``, or enough programs for two per processor."""
    return fixed or max(1, min(MAX_SPLITS, -(-2 * _processors(device) // (batch * kv_heads))))


def paged_decode(
    query_BH1D: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    tables_BN: torch.Tensor,
    positions_B1: torch.Tensor,
    page: int,
    scale: float,
    kv_splits: int = 0,
) -> torch.Tensor:
    """Attention of each row's one query over its pages: ``[B, 1, heads, head_dim]``.

    ``keys`` and ``values`` are one layer of the pool, ``[kv_heads, tokens, head_dim]``; ``kv_splits``
    cuts each row's keys so many ways (0: :func:`decode_splits` by the batch).
    """
    batch, heads, _, head_dim = query_BH1D.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads
    splits = decode_splits(batch, kv_heads, query_BH1D.device, kv_splits)
    out = torch.empty((batch, 1, heads, head_dim), dtype=query_BH1D.dtype, device=query_BH1D.device)
    # With one split the kernel writes the output itself and never touches these.
    part = torch.empty((batch, heads, splits, head_dim) if splits > 1 else (1, 1, 1, 1), device=out.device)
    lse = torch.empty((batch, heads, splits) if splits > 1 else (1, 1, 1), device=out.device)
    block_d = max(16, triton.next_power_of_2(head_dim))
    _paged_decode[(batch, kv_heads, splits)](
        query_BH1D,
        keys,
        values,
        out,
        part,
        lse,
        tables_BN,
        positions_B1,
        splits,
        query_BH1D.stride(0),
        query_BH1D.stride(1),
        query_BH1D.stride(3),
        keys.stride(0),
        keys.stride(1),
        out.stride(0),
        out.stride(2),
        tables_BN.stride(0),
        positions_B1.stride(0),
        part.stride(0),
        part.stride(1),
        part.stride(2),
        lse.stride(0),
        lse.stride(1),
        scale,
        GROUP=group,
        # tl.dot takes blocks of at least 16 on each side.
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        PAGE=page,
        BLOCK_N=BLOCK_N,
        # float32 models are compared with SDPA to the last bits; TF32 would round their products.
        PRECISION="ieee" if query_BH1D.dtype == torch.float32 else "tf32",
    )
    if splits > 1:
        _merge_splits[(batch, heads)](
            part,
            lse,
            out,
            splits,
            part.stride(0),
            part.stride(1),
            part.stride(2),
            lse.stride(0),
            lse.stride(1),
            out.stride(0),
            out.stride(2),
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_S=MAX_SPLITS,
        )
    return out
