"""The one interface of a byte channel, seen from the peer at either end of a transfer.

A channel is how a version's bytes travel between two processes; the *delivery mode* (see
:mod:`services.paramsync.delivery`) is who starts the transfer: replicas pulling a version, or
paramsync pushing one. ``send`` is the end a trainer holds, ``receive`` the end a replica holds;
paramsync's own end of each channel lives in the channel's module beside them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from services.paramsync.errors import ChecksumMismatch
from services.paramsync.manifest import Manifest

ChannelName = Literal["tcp", "grpc_chunks", "disk", "torch_dist"]

# Given the manifest, one writable view per tensor (in manifest order) to receive it into.
Place = Callable[[Manifest], Sequence[memoryview]]


@dataclass(frozen=True, slots=True)
class TensorRun:
    """Bytes [``start``, ``end``) of a streamed upload, which begin inside tensor ``first_tensor``:
    the checksums of the tensors whose last byte they hold (from ``first_tensor`` on), one view per
    tensor they touch (``Manifest.run_parts``), and where those parts lie when they are in one of this
    process's memory files (``shared``: the descriptor and each part's offset; see
    ``services/paramsync/memory_files.py``). A tensor larger than a bucket spans several runs."""

    first_tensor: int
    checksums: list[str]
    views: list[memoryview]
    start: int
    end: int
    shared: tuple[int, list[int]] | None = None


class ByteChannel(ABC):
    name: ClassVar[ChannelName]

    @abstractmethod
    async def send(self, manifest: Manifest, runs: AsyncIterator[TensorRun], resume_from: int = 0) -> int:
        """Sends an open ``manifest``, then its tensors run by run (each run's checksums before its
        bytes) from byte ``resume_from``; returns the bytes the other end stored (0: it already
        held this version with these bytes). Waiting for the next run is the caller's."""

    @abstractmethod
    async def receive(self, version: int, place: Place) -> Manifest:
        """Receives ``version`` (0: the latest) into the views ``place`` gives once the manifest is
        known, every tensor verified against its checksum; returns the complete manifest."""


def check_digests(manifest: Manifest, digests: Sequence[str]) -> Manifest:
    """A receiving end's last step: every tensor's digest, in manifest order, equals the checksum
    the (closed) manifest promises; returns the manifest."""
    for spec, digest in zip(manifest.tensors, digests, strict=True):
        if digest != spec.checksum:
            raise ChecksumMismatch(f"tensor {spec.name!r} of version {manifest.version}: checksum {digest} != expected")
    return manifest
