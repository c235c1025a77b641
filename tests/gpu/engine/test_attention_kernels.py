"""The attention kernels on the GPU as the engine builds them, against SDPA in float32 over each
row's own keys and values, in bfloat16 on Qwen2.5-0.5B's heads (14 query heads over 2 KV heads of 64
dimensions) and CUDA's 128-token pages, pages out of order: flex_attention compiled (its queries
folded by KV head, its pages listed full or partial) for a decode step and a prefill longer than a
query block; the triton decode kernel with each row's keys unsplit, split by the batch, and split
16 ways over rows shorter than 16 tiles. Seconds each, where the engine's own tests take minutes
to reach the same kernels.

Run with ``make test-gpu``; skipped without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from tests.unit.engine.test_attention import check_against_dense

pytestmark = pytest.mark.gpu

# Rows of 1 to 8 pages; the one of 2 tokens leaves most splits of a 16-way split past its end.
LENGTHS = [300, 128, 2, 129, 1000]


@pytest.mark.parametrize(
    ("queries", "lengths"),
    # 40 queries of 7 heads each fill three of flex_attention's 128-row query blocks.
    [(1, LENGTHS), (40, [300, 128, 40, 129, 1000])],
    ids=["decode", "prefill-over-query-blocks"],
)
def test_compiled_flex_attention_equals_dense_attention(queries: int, lengths: list[int]) -> None:
    check_against_dense("flex_attention", queries, lengths, 14, 2, 64, 128, device="cuda", dtype=torch.bfloat16)


@pytest.mark.parametrize("kv_splits", [1, 0, 16], ids=["unsplit", "split-by-batch", "split-16"])
def test_the_triton_decode_kernel_equals_dense_attention(kv_splits: int) -> None:
    check_against_dense("triton", 1, LENGTHS, 14, 2, 64, 128, kv_splits=kv_splits, device="cuda", dtype=torch.bfloat16)
