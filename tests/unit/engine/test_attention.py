"""Both attention backends over a paged pool equal dense SDPA over each sequence's own keys and
values (float32, tight tolerance), whatever order the pool's blocks were handed out in."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from services.engine.attention import PassInputs, backend_named, pad_tables
from services.engine.kv_pool import BlockPool, KVLayout

HEADS, KV_HEADS, HEAD_DIM, PAGE = 4, 2, 8, 4


@pytest.mark.parametrize("backend", ["torch_native", "flex_attention"])
@pytest.mark.parametrize("queries", [1, 3], ids=["decode", "prefill"])
def test_paged_attention_equals_dense_attention_per_sequence(backend: str, queries: int) -> None:
    torch.manual_seed(0)
    pool = BlockPool(KVLayout(1, KV_HEADS, HEAD_DIM, torch.float32), PAGE, max_blocks=32)
    lengths = [5, 11, 1 + queries]  # after this pass; the last sequence is almost all new
    tables = [pool.allocate(-(-n // PAGE)) for n in lengths]
    tables[1].reverse()  # blocks out of order in the pool
    dense_k = [torch.randn(KV_HEADS, n, HEAD_DIM) for n in lengths]
    dense_v = [torch.randn(KV_HEADS, n, HEAD_DIM) for n in lengths]
    positions = torch.tensor([list(range(n - queries, n)) for n in lengths])
    for table, n, k, v in zip(tables, lengths, dense_k, dense_v, strict=True):
        flat = pool.token_index(table, torch.arange(n))
        pool.keys[0][:, flat] = k
        pool.values[0][:, flat] = v
    query = torch.randn(len(lengths), HEADS, queries, HEAD_DIM)
    unused_writes = torch.zeros(len(lengths), queries, dtype=torch.long)
    inputs = PassInputs(unused_writes, pad_tables(tables, pool.layout.device), positions, torch.tensor(lengths))
    attention = backend_named(backend, torch.device("cpu"))

    out = attention.attend(attention.plan(pool, inputs), pool, 0, query, HEAD_DIM**-0.5)

    for b, (n, k, v) in enumerate(zip(lengths, dense_k, dense_v, strict=True)):
        mask = torch.arange(n) <= positions[b][:, None]
        reference = F.scaled_dot_product_attention(query[b : b + 1], k[None], v[None], attn_mask=mask, enable_gqa=True)
        torch.testing.assert_close(out[b], reference[0].transpose(0, 1), atol=1e-6, rtol=1e-5)
