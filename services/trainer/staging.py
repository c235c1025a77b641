"""Host copies of gathered weights for the upload: the device-specific step of a publish.

A publish gathers each bucket of full tensors where the weights live (the GPU under NCCL), then
copies it once to host memory, which the upload reads. On CUDA the copy goes into pinned memory
on a stream of its own, so it runs while the next bucket is gathered (and while the previous one
is uploaded); an event per bucket says when its bytes are on the host. On CPU the same calls copy
at once into plain memory and nothing overlaps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

# Each tensor starts on this boundary inside a bucket's host buffer, so a view of any dtype is aligned.
ALIGN_BYTES = 64


@dataclass(frozen=True, slots=True)
class Gathered:
    """One full tensor of a bucket; ``private`` when it is already memory no one else writes
    (gathered bytes), as opposed to a live parameter that training will change."""

    tensor: torch.Tensor
    private: bool


@dataclass(slots=True)
class Staged:
    """A bucket's host tensors (allocated already) and, while a copy into them may still run, the
    event that marks its end."""

    tensors: list[torch.Tensor]
    copied: torch.cuda.Event | None = None

    def wait(self) -> list[torch.Tensor]:
        """The host tensors, once their bytes have arrived."""
        if self.copied is not None:
            self.copied.synchronize()
        return self.tensors


class HostStaging(Protocol):
    """Copies buckets to host memory; ``depth`` is how many staged buckets may still be in flight
    when the next is gathered (0: each copy is done before the next gather starts)."""

    depth: int

    def stage(self, bucket: Sequence[Gathered]) -> Staged: ...


class SyncStaging:
    """The CPU's staging: a private contiguous copy of each tensor, made at once (none for bytes the
    gather already made private and contiguous)."""

    def __init__(self, depth: int = 0) -> None:
        self.depth = depth

    def stage(self, bucket: Sequence[Gathered]) -> Staged:
        out = []
        for item in bucket:
            t = item.tensor.detach()
            if item.private and t.device.type == "cpu":
                out.append(t.contiguous())
            else:
                out.append(t.to("cpu", copy=True).contiguous())
        return Staged(out)


class CudaStaging:
    """One pinned host buffer per bucket (torch's caching host allocator reuses freed ones), filled
    on a copy stream that first waits for the work already queued (the gather); the gathered GPU
    memory is kept from reuse until the copy has read it (``record_stream``)."""

    depth = 1

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device=device)

    def stage(self, bucket: Sequence[Gathered]) -> Staged:
        offsets, size = [], 0
        for item in bucket:
            offsets.append(size)
            size += -(-item.tensor.numel() * item.tensor.element_size() // ALIGN_BYTES) * ALIGN_BYTES
        host = torch.empty(max(size, 1), dtype=torch.uint8, pin_memory=True)
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        out = []
        with torch.cuda.stream(self.stream):
            for item, start in zip(bucket, offsets, strict=True):
                t = item.tensor.detach()
                nbytes = t.numel() * t.element_size()
                view = host[start : start + nbytes].view(t.dtype).view(t.shape)
                view.copy_(t, non_blocking=True)
                if t.device.type == "cuda":
                    t.record_stream(self.stream)
                out.append(view)
        event = torch.cuda.Event()
        event.record(self.stream)
        return Staged(out, event)


def host_staging(device: torch.device) -> HostStaging:
    """The staging for weights that live on ``device``."""
    return CudaStaging(device) if device.type == "cuda" else SyncStaging()
