"""``rollout_dtype``: what a publish casts, where, and what its manifest promises, in one process
(the multi-rank path to paramsync and an engine is tests/integration/trainer/test_publish_dtype.py)."""

from __future__ import annotations

import pytest
import torch

from services.trainer.config import TrainerSettings
from services.trainer.gather import BucketGather, weight_specs


@pytest.mark.parametrize(
    ("device", "rollout_dtype", "expected"),
    [
        ("cpu", "auto", "float32"),
        ("cuda", "auto", "bfloat16"),
        ("cpu", "bf16", "bfloat16"),
        ("cuda", "fp32", "float32"),
        ("cpu", "fp16", "float16"),
    ],
)
def test_auto_matches_the_engines_own_auto_and_an_explicit_dtype_wins(device, rollout_dtype, expected):
    # model_construct: no device check, so the cuda rows read the same on a machine without a GPU.
    settings = TrainerSettings.model_construct(device=device, rollout_dtype=rollout_dtype)
    assert settings.resolved_rollout_dtype == expected


def test_a_bad_rollout_dtype_names_the_setting():
    with pytest.raises(ValueError, match="rollout_dtype"):
        TrainerSettings(rollout_dtype="int8")


def test_floating_point_weights_are_cast_and_integer_buffers_kept():
    weight = torch.randn(64, 8)
    counter = torch.arange(5, dtype=torch.int64)
    items = [("w", weight), ("n", counter)]
    before = weight.clone()

    gather = BucketGather(1024, dtype=torch.bfloat16)
    got = [t for bucket in gather.buckets(items) for t in bucket]

    # A row range per bucket (1024 bytes of fp32 rows), each cast on its own: together the cast tensor.
    assert len(got) > 2
    cast = torch.cat(got[:-1])
    assert cast.dtype == torch.bfloat16 and torch.equal(cast, weight.to(torch.bfloat16))
    assert got[-1].dtype == torch.int64 and torch.equal(got[-1], counter)
    assert torch.equal(weight, before), "the live fp32 weight is left alone"

    specs = {s.name: s for s in weight_specs(items, torch.bfloat16)}
    assert (specs["w"].dtype, specs["w"].num_bytes) == ("bfloat16", 64 * 8 * 2)
    assert (specs["n"].dtype, specs["n"].num_bytes) == ("int64", 5 * 8)
    assert [s.dtype for s in weight_specs(items)] == ["float32", "int64"]
