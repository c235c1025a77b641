"""Row ranges of a row-sharded tensor, and which of their rows each rank holds.

FSDP2 splits a parameter's rows over the ranks as ``torch.chunk`` does: rank r holds rows
[r·c, min((r+1)·c, n)), c = ceil(n / world). A publish gathers full tensors a bucket at a time;
a tensor larger than a bucket (the 0.5B shape's 545 MB embedding against 64 MB buckets) is
gathered as several row ranges, one per bucket, so rank 0 never holds more than a bucket of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Rows:
    """Rows [``start``, ``stop``) of ``tensor`` (a DTensor sharded by rows, or a plain tensor)."""

    tensor: torch.Tensor
    start: int
    stop: int

    @classmethod
    def whole(cls, tensor: torch.Tensor) -> Rows:
        return cls(tensor, 0, tensor.shape[0] if tensor.dim() else 0)

    @property
    def is_whole(self) -> bool:
        return self.start == 0 and self.stop == (self.tensor.shape[0] if self.tensor.dim() else 0)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape) if self.is_whole else (self.stop - self.start, *self.tensor.shape[1:])

    @property
    def row_bytes(self) -> int:
        rows = self.tensor.shape[0] if self.tensor.dim() else 0
        return self.tensor.numel() // rows * self.tensor.element_size() if rows else 0

    @property
    def nbytes(self) -> int:
        return (self.stop - self.start) * self.row_bytes if self.tensor.dim() else self.tensor.element_size()

    def rows_per_rank(self, world: int) -> int:
        """The most rows of the whole tensor one rank holds: c = ceil(n / world)."""
        return -(-self.tensor.shape[0] // world)

    def shard_rows(self, rank: int, world: int) -> int:
        """How many rows of the whole tensor ``rank`` holds."""
        per_rank = self.rows_per_rank(world)
        return max(0, min(per_rank, self.tensor.shape[0] - rank * per_rank))

    def own(self, rank: int, world: int) -> tuple[int, int, int]:
        """``rank``'s rows among these: (first of them in its shard, first of them in these rows, count)."""
        per_rank = self.rows_per_rank(world)
        low = max(self.start, rank * per_rank)
        high = min(self.stop, (rank + 1) * per_rank, self.tensor.shape[0])
        return low - rank * per_rank, low - self.start, max(0, high - low)

    def split(self, max_bytes: int) -> list[Rows]:
        """These rows as ranges of at most ``max_bytes`` each (at least one row each)."""
        step = max(1, max_bytes // self.row_bytes) if self.row_bytes else self.stop - self.start
        if self.stop - self.start <= step:
            return [self]
        return [Rows(self.tensor, low, min(low + step, self.stop)) for low in range(self.start, self.stop, step)]
