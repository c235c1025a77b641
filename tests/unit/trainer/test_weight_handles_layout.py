"""How a version shared by handle is cut into update calls, and when a slot may be rewritten."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from services.paramsync.manifest import TensorSpec
from services.trainer.weight_handles import layout, slot_is_free


def spec(name: str, dtype: str, *shape: int) -> TensorSpec:
    numel = 1
    for d in shape:
        numel *= d
    return TensorSpec(name, dtype, shape, numel * getattr(torch, dtype).itemsize, "")


def test_buckets_are_cut_where_the_dtype_changes_or_the_size_would_pass_the_cap():
    specs = [spec("a", "bfloat16", 4, 8), spec("b", "bfloat16", 8), spec("c", "float32", 3), spec("d", "bfloat16", 16)]
    buckets = layout(specs, bucket_bytes=70)
    assert [[m.name for m in b.metadata] for b in buckets] == [["a"], ["b"], ["c"], ["d"]]
    buckets = layout(specs, bucket_bytes=80)
    assert [[m.name for m in b.metadata] for b in buckets] == [["a", "b"], ["c"], ["d"]]
    first = buckets[0]
    assert (first.dtype, first.numel) == (torch.bfloat16, 40)
    assert [(m.start_idx, m.end_idx, tuple(m.shape)) for m in first.metadata] == [(0, 32, (4, 8)), (32, 40, (8,))]


def table(latest: int, *versions: int) -> SimpleNamespace:
    return SimpleNamespace(latest_version=latest, replicas=[SimpleNamespace(version=v) for v in versions])


def test_a_slot_is_rewritten_only_once_no_replica_can_still_read_its_version():
    assert slot_is_free(0, table(0))
    assert slot_is_free(3, table(4, 3, 5))
    assert not slot_is_free(3, table(4, 2, 5)), "a replica below the slot's version may be loading it"
    assert not slot_is_free(3, table(3, 3)), "a replica joining now is told of version 3: its slot is in use"
