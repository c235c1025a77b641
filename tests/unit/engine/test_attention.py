"""Every attention backend over a paged pool equals dense SDPA over each sequence's own keys and
values (float32, tight tolerance), whatever order the pool's blocks were handed out in (triton's
in ``test_triton.py``, in Triton's CPU interpreter); triton outside CUDA is refused at start."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from relayrl.config import SettingsError
from services.engine.attention import Q_BLOCK, PassInputs, backend_named, paged_block_mask
from services.engine.kv_pool import BlockPool, KVLayout

HEADS, KV_HEADS, HEAD_DIM, PAGE = 4, 2, 8, 4


@pytest.mark.parametrize("backend", ["torch_native", "flex_attention"])
@pytest.mark.parametrize("queries", [1, 3], ids=["decode", "prefill"])
def test_paged_attention_equals_dense_attention_per_sequence(backend: str, queries: int) -> None:
    # After this pass; the last sequence is almost all new.
    check_against_dense(backend, queries, [5, 11, 1 + queries], HEADS, KV_HEADS, HEAD_DIM, PAGE)


@pytest.mark.parametrize(
    ("heads", "queries", "lengths"),
    [(14, 1, [5, 9, 16, 1]), (6, 50, [53, 70, 50])],
    ids=["decode-group-of-7", "prefill-of-several-query-blocks"],
)
@pytest.mark.parametrize("backend", ["torch_native", "flex_attention"])
def test_paged_attention_equals_dense_attention_for_odd_groups_and_long_passes(
    backend: str, heads: int, queries: int, lengths: list[int]
) -> None:
    # Qwen2.5-0.5B's 14 query heads over 2 KV heads; a pass whose folded rows (50 x 3) span two
    # of flex_attention's query blocks, the second one's rows all past the first's positions.
    check_against_dense(backend, queries, lengths, heads, KV_HEADS, HEAD_DIM, PAGE)


@pytest.mark.parametrize(
    ("heads", "queries", "lengths"),
    [(14, 1, [5, 8, 9, 16, 1, 0]), (6, 50, [53, 70, 50])],
    ids=["decode", "prefill"],
)
def test_flex_attentions_block_lists_are_what_its_kernels_assume(heads: int, queries: int, lengths: list[int]) -> None:
    """The compiled kernels skip the mask on a full block and never visit an unlisted one (the
    eager path, which the equality tests run, ignores both lists): each full page is seen whole by
    every query of its block, each page any query sees is listed, and a decode step leaves the mask
    one page per row at most, its last."""
    group = heads // KV_HEADS
    pool = BlockPool(KVLayout(1, KV_HEADS, HEAD_DIM, torch.float32), PAGE, max_blocks=64)
    tables = [pool.allocate(-(-n // PAGE)) for n in lengths]
    tables[1].reverse()
    tables_BN = torch.nn.utils.rnn.pad_sequence([torch.tensor(t, dtype=torch.long) for t in tables], batch_first=True)
    # A row of length 0 is a CUDA graph's padding row: position 0.
    positions = torch.tensor([list(range(max(n - queries, 0), max(n - queries, 0) + queries)) for n in lengths])
    mask = paged_block_mask(pool, tables_BN, torch.tensor(lengths), positions, group)

    rows = queries * group
    q = torch.arange(rows)
    kv = torch.arange(pool.capacity * PAGE)
    for b in range(len(lengths)):
        seen_QP = mask.mask_mod(torch.tensor(b), torch.tensor(0), q[:, None], kv[None]).view(rows, pool.capacity, PAGE)
        for block in range(-(-rows // Q_BLOCK)):
            seen_P = seen_QP[block * Q_BLOCK : (block + 1) * Q_BLOCK]
            full = set(mask.full_kv_indices[b, 0, block, : mask.full_kv_num_blocks[b, 0, block]].tolist())
            partial = set(mask.kv_indices[b, 0, block, : mask.kv_num_blocks[b, 0, block]].tolist())
            assert not full & partial
            assert all(seen_P[:, page].all() for page in full)
            assert set(seen_P.any(-1).any(0).nonzero().flatten().tolist()) <= full | partial
            if queries == 1 and lengths[b]:
                assert len(partial) <= 1 and partial <= {tables[b][-1]}
                assert len(full) == lengths[b] // PAGE


def check_against_dense(
    backend: str,
    queries: int,
    lengths: list[int],
    heads: int,
    kv_heads: int,
    head_dim: int,
    page: int,
    kv_splits: int = 0,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> None:
    """``backend`` over a pool of ``dtype`` on ``device`` against SDPA in float32 over each row's own
    keys and values: to the last bits in float32, to bfloat16's rounding of the output otherwise."""
    torch.manual_seed(0)
    on = torch.device(device)
    pool = BlockPool(KVLayout(1, kv_heads, head_dim, dtype, on), page, max_blocks=64)
    tables = [pool.allocate(-(-n // page)) for n in lengths]
    tables[1].reverse()  # blocks out of order in the pool
    dense_k = [torch.randn(kv_heads, n, head_dim, device=on).to(dtype) for n in lengths]
    dense_v = [torch.randn(kv_heads, n, head_dim, device=on).to(dtype) for n in lengths]
    positions = torch.tensor([list(range(n - queries, n)) for n in lengths], device=on)
    for table, n, k, v in zip(tables, lengths, dense_k, dense_v, strict=True):
        flat = torch.from_numpy(pool.token_index(np.array([table]), np.arange(n)[None])[0]).to(on)
        pool.keys[0][:, flat] = k
        pool.values[0][:, flat] = v
    query = torch.randn(len(lengths), heads, queries, head_dim, device=on).to(dtype)
    unused_writes = torch.zeros(len(lengths), queries, dtype=torch.long, device=on)
    # Tables padded with the scratch block, 0.
    tables_BN = torch.nn.utils.rnn.pad_sequence([torch.tensor(table) for table in tables], batch_first=True).to(on)
    inputs = PassInputs(unused_writes, tables_BN, positions, torch.tensor(lengths, device=on), max(lengths))
    attention = backend_named(backend, on, heads // kv_heads, kv_splits)

    out = attention.attend(attention.plan(pool, inputs), pool, 0, query, head_dim**-0.5)

    tolerance = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    for b, (n, k, v) in enumerate(zip(lengths, dense_k, dense_v, strict=True)):
        mask = torch.arange(n, device=on) <= positions[b][:, None]
        q, k, v = query[b : b + 1].float(), k[None].float(), v[None].float()
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        torch.testing.assert_close(out[b].float(), reference[0].transpose(0, 1), **tolerance)


def test_the_triton_backend_outside_cuda_and_the_interpreter_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    with pytest.raises(SettingsError) as err:
        backend_named("triton", torch.device("cpu"), 2)

    assert "RELAYRL_ENGINE_ATTENTION_BACKEND=triton" in err.value.one_line()
