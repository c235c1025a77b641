"""One rank of the shared-memory gather test (launched by torchrun from test_host_gather.py).

``python -m ... OUT``: both ranks row-shard the same seeded tensors (rows that split unevenly,
a tensor whose second rank holds no row, a 1-D one, bf16 beside float32 and int64, one larger
than a bucket, which comes in row ranges) and gather them in small buckets through
:class:`~services.trainer.gather.BucketGather` with shared host memory, three times: keeping
every bucket, again after the shards changed while the first buckets are still kept, then
dropping each bucket as it comes; and a fourth time with every buffer held and rank 0 unable to
open a file (so to make a new buffer). Rank 0 writes what it saw to OUT as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
from collections.abc import Iterator

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from services.trainer import distributed as D
from services.trainer.gather import BucketGather

BUCKET_BYTES = 64
SHAPES = {"uneven": ((5, 3), torch.float32), "one_row": ((1, 4), torch.bfloat16), "wide": ((64, 16), torch.float32)}


def main(out: str) -> None:
    D.init_distributed("cpu")
    mesh = init_device_mesh("cpu", (D.world_size(),))
    generator = torch.Generator().manual_seed(0)
    full = {name: torch.randn(shape, generator=generator).to(dtype) for name, (shape, dtype) in SHAPES.items()}
    full["counts"] = torch.arange(7, dtype=torch.int64)
    items = [(name, distribute_tensor(t, mesh, [Shard(0)])) for name, t in full.items()]
    gather = BucketGather(BUCKET_BYTES, share_host_memory=True)
    is_main = D.get_rank() == 0

    kept = list(gather.buckets(items))
    _add_one(items)
    kept_too = list(gather.buckets(items))
    first, second = _joined(kept, full), _joined(kept_too, full)
    result = {
        "shared": gather.shares_host_memory,
        "buckets": len(kept),
        # Bytes of each piece of the tensor larger than a bucket.
        "wide_pieces": [t.numel() * t.element_size() for t in _flat(kept) if t.shape[1:] == (16,)],
        # The first gather's tensors, still held while the second gather ran.
        "first_equal": [torch.equal(t, full[n]) for t, n in zip(first, full, strict=True)] if is_main else [],
        "second_equal": [torch.equal(t, full[n] + 1) for t, n in zip(second, full, strict=True)] if is_main else [],
        "buffers_kept": _buffers(gather),
    }
    del kept, kept_too, first, second
    _add_one(items)
    streamed = []
    for bucket in gather.buckets(items):
        # Each bucket's rows cloned before it is dropped: its buffer is free again for the next.
        streamed.append([t.clone() for t in bucket])
        del bucket
    # One added twice, as to the shards: the same rounding as theirs.
    equal = (
        [torch.equal(t, full[n] + 1 + 1) for t, n in zip(_joined(streamed, full), full, strict=True)] if is_main else []
    )
    result.update(streamed_equal=equal, buffers_after_streaming=_buffers(gather))

    # Every buffer held, and rank 0 out of file descriptors for a new one: the all-gather serves.
    held = [list(gather.buckets(items)), list(gather.buckets(items))]
    with _no_new_files(is_main):
        fallback = _joined(list(gather.buckets(items)), full)
    equal = [torch.equal(t, full[n] + 1 + 1) for t, n in zip(fallback, full, strict=True)] if is_main else []
    result.update(fallback_equal=equal, buffers_after_fallback=_buffers(gather))
    del held
    if is_main:
        with open(out, "w") as f:
            json.dump(result, f)
    D.exit_rank()


@contextlib.contextmanager
def _no_new_files(active: bool) -> Iterator[None]:
    """No file descriptor can be opened while inside (on the rank where ``active``)."""
    if not active:
        yield
        return
    lowest_free = os.dup(0)
    os.close(lowest_free)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _add_one(items: list[tuple[str, torch.Tensor]]) -> None:
    with torch.no_grad():
        for _, t in items:
            t.to_local().add_(1)


def _flat(buckets: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [t for bucket in buckets for t in bucket]


def _joined(buckets: list[list[torch.Tensor]], full: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The buckets' tensors with each one's row ranges joined again (rank 0; [] elsewhere)."""
    pieces, joined = iter(_flat(buckets)), []
    if not any(buckets):
        return []
    for tensor in full.values():
        parts = [next(pieces)]
        while sum(p.shape[0] for p in parts) < tensor.shape[0]:
            parts.append(next(pieces))
        joined.append(torch.cat(parts))
    return joined


def _buffers(gather: BucketGather) -> int:
    return gather._host.buffers() if gather._host is not None else 0


if __name__ == "__main__":
    main(sys.argv[1])
