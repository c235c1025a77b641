"""Versions shared by handle with engines on the trainer's host (``share_weights_by_handle``).

Where trainer and engine share a GPU, a version's bytes need not leave it: rank 0 keeps a copy of
each published version in GPU memory of its own and hands paramsync one handle per bucket of it
(SGLang's ``update_weights_from_tensor`` payloads, ``flattened_bucket``; a CUDA IPC handle on a
GPU, a shared-memory segment on a CPU). A replica on this host gives its engine the handles and
the engine copies the version from this memory into its parameters: one device-to-device copy, no
round trip through host memory. The bytes still go to paramsync as always (replicas elsewhere,
restarts, a replica whose engine cannot open the handles), and the version is still numbered,
checksummed and announced there.

The memory must not change while an engine may still read it, and the trainer must never wait
for an engine. So there are two slots, written in turn, and a slot is rewritten only once
nothing can read its version any more: a newer version is at paramsync (a replica that joins
from now on is told of that one) and every replica in paramsync's table has reported holding
this version or a newer one. Where that does not hold yet (a replica still loading, or one that
went away without leaving the table), the version goes out as bytes only. The memory is written
in the training stream before each bucket's copy to the host is queued, and paramsync announces
a version with handles only once all its bytes have arrived: by then the copy into the slot is
done as well.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from services.engine.tensor_updates import FLATTENED_BUCKET, FlattenedTensorMetadata, serialize
from services.paramsync.manifest import TensorSpec, WeightHandles

log = logging.getLogger(__name__)

SLOTS = 2
# Each handle is one update call at the engine: few and large, cut only where the dtype changes
# or a bucket would pass this size (a 0.5B model in bf16 is one bucket).
HANDLE_BUCKET_BYTES = 2 * 1024**3


class ReplicaTable(Protocol):
    """Paramsync's version table, as the trainer reads it (``VersionTable``)."""

    latest_version: int
    replicas: Sequence[Any]


@dataclass(frozen=True, slots=True)
class _Bucket:
    """Consecutive tensors of one dtype: their metadata within one flat tensor of ``numel`` elements."""

    dtype: torch.dtype
    metadata: tuple[FlattenedTensorMetadata, ...]
    numel: int


def layout(specs: Sequence[TensorSpec], bucket_bytes: int = HANDLE_BUCKET_BYTES) -> list[_Bucket]:
    """The version's tensors in upload order, cut into flat buckets of one dtype each."""
    buckets: list[_Bucket] = []
    run: list[FlattenedTensorMetadata] = []
    dtype: torch.dtype | None = None
    numel = 0
    for spec in specs:
        spec_dtype = getattr(torch, spec.dtype)
        count = spec.num_bytes // spec_dtype.itemsize
        if run and (spec_dtype != dtype or (numel + count) * spec_dtype.itemsize > bucket_bytes):
            buckets.append(_Bucket(dtype, tuple(run), numel))  # type: ignore[arg-type]
            run, numel = [], 0
        dtype = spec_dtype
        run.append(FlattenedTensorMetadata(spec.name, torch.Size(spec.shape), spec_dtype, numel, numel + count, count))
        numel += count
    if run:
        buckets.append(_Bucket(dtype, tuple(run), numel))  # type: ignore[arg-type]
    return buckets


def slot_is_free(held_version: int, table: ReplicaTable) -> bool:
    """Whether no engine can still read a slot holding ``held_version`` (0: never written)."""
    if held_version == 0:
        return True
    return table.latest_version > held_version and all(r.version >= held_version for r in table.replicas)


@dataclass
class _Slot:
    version: int = 0
    buffers: list[torch.Tensor] = field(default_factory=list)


class SlotWriter:
    """Writes one version into its slot: the gathered tensors of each publish bucket, in upload
    order (the concatenation of the upload's tensors is the version's bytes in manifest order)."""

    def __init__(self, buckets: list[_Bucket], buffers: list[torch.Tensor]) -> None:
        self._buckets = buckets
        self._buffers = buffers
        self._bucket = 0
        self._offset = 0  # elements written into the current buffer

    def write(self, tensors: Sequence[torch.Tensor]) -> None:
        """Copies gathered tensors (whole tensors, or row ranges of one in order) into the slot."""
        for tensor in tensors:
            flat = tensor.detach().reshape(-1)
            while flat.numel():
                if self._offset == self._buckets[self._bucket].numel:
                    self._bucket, self._offset = self._bucket + 1, 0
                buffer = self._buffers[self._bucket]
                take = min(flat.numel(), buffer.numel() - self._offset)
                buffer[self._offset : self._offset + take].copy_(flat[:take])
                flat, self._offset = flat[take:], self._offset + take

    @property
    def complete(self) -> bool:
        return self._bucket == len(self._buckets) - 1 and self._offset == self._buckets[-1].numel


class HandleSlots:
    """Rank 0's two slots on ``device``; :meth:`claim` gives the writer and handles of one version."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._slots = [_Slot() for _ in range(SLOTS)]
        self._held_back = False
        if device.type == "cpu":
            # Another process can open a CPU tensor only by name (see services/engine/tensor_updates.py).
            torch.multiprocessing.set_sharing_strategy("file_system")

    def claim(
        self, version: int, specs: Sequence[TensorSpec], table: ReplicaTable | None
    ) -> tuple[SlotWriter, WeightHandles] | None:
        """The slot for ``version`` (the older one) with its writer and handles, or None when an
        engine may still read it (or the table could not be read): the version goes as bytes only."""
        slot = min(self._slots, key=lambda s: s.version)
        if table is None or not slot_is_free(slot.version, table):
            if not self._held_back:
                behind = [] if table is None else [r.replica_id for r in table.replicas if r.version < slot.version]
                log.info(
                    "version %d goes to engines as bytes only: version %d's shared memory may still be read (%s)",
                    version,
                    slot.version,
                    ", ".join(behind) or "no version table",
                )
            self._held_back = True
            return None
        self._held_back = False
        buckets = layout(specs)
        if [(b.numel, b.dtype) for b in buckets] != [(t.numel(), t.dtype) for t in slot.buffers]:
            slot.buffers = []  # drop the old memory before taking the new
            slot.buffers = [self._empty(b) for b in buckets]
        slot.version = version
        payloads = tuple(
            serialize({"flattened_tensor": buffer, "metadata": list(bucket.metadata)})
            for bucket, buffer in zip(buckets, slot.buffers, strict=True)
        )
        return SlotWriter(buckets, slot.buffers), WeightHandles(socket.gethostname(), FLATTENED_BUCKET, payloads)

    def _empty(self, bucket: _Bucket) -> torch.Tensor:
        buffer = torch.empty(bucket.numel, dtype=bucket.dtype, device=self.device)
        return buffer.share_memory_() if self.device.type == "cpu" else buffer
