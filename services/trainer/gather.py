"""The actor's full weights, gathered bucket by bucket for a publish (collective on every rank).

verl's FSDP weight sync gathers one bucket of parameters at a time (its
``update_weights_bucket_megabytes``) instead of the whole state dict, so no rank ever holds a
second full copy of the model. Here every rank walks the sharded state dict in the same order and
all-gathers each tensor (``DTensor.full_tensor``); rank 0 keeps the full tensors of the current
bucket as private CPU copies and hands the bucket on; the other ranks drop theirs at once.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator

import torch

from services.paramsync.manifest import TensorSpec
from services.paramsync.tensors import open_spec
from services.trainer import distributed as D


def _sharded_items(actor: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return list(actor.state_dict().items())


def weight_specs(actor: torch.nn.Module) -> list[TensorSpec]:
    """Every published tensor's name, dtype and full shape, known before anything is gathered."""
    return [open_spec(name, t) for name, t in _sharded_items(actor)]


class BucketGather:
    """Gathers the actor's full tensors in buckets of about ``bucket_bytes`` and keeps count of the
    gathered bytes alive on rank 0 (``peak_live_bytes``: what publishing costs in memory there)."""

    def __init__(self, bucket_bytes: int) -> None:
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = bucket_bytes
        self._lock = threading.Lock()
        self.live_bytes = 0
        self.peak_live_bytes = 0

    def _track(self, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        with self._lock:
            self.live_bytes += nbytes
            self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        weakref.finalize(tensor, self._release, nbytes)

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self.live_bytes -= nbytes

    def buckets(self, actor: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
        """Yields rank 0's buckets of full CPU tensors in state-dict order (empty lists elsewhere).

        Collective: every rank must drain the iterator. The tensors are private copies, because
        training goes on while the upload reads them.
        """
        is_main = D.get_rank() == 0
        bucket: list[torch.Tensor] = []
        size = 0
        for _, tensor in _sharded_items(actor):
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            size += full.numel() * full.element_size()
            if is_main:
                # A gathered DTensor is new memory already; a plain tensor is the live parameter.
                fresh = full is not tensor and full.device.type == "cpu"
                kept = full.detach().contiguous() if fresh else full.detach().to("cpu", copy=True).contiguous()
                self._track(kept)
                bucket.append(kept)
            del full
            if size >= self.bucket_bytes:
                yield bucket
                bucket, size = [], 0
        if size or bucket:
            yield bucket
