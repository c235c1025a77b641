"""The gather of row-sharded weights through memory the ranks of one host share (CPU trainers).

Gloo's all-gather moves every rank's rows through loopback TCP to every other rank, and rank 0
then copies the gathered rows into full tensors: on the 52 MB ``small`` preset that was ~140 ms of
a ~270 ms weight version, with both ranks on one core. When every rank runs on this host, each
rank instead writes its rows once, straight to their place in a bucket buffer that rank 0 maps,
and rank 0 hands out views of that buffer: one copy in all, and two small collectives per bucket
(the buffer's name, then a barrier once every rank has written).

Buffers are memfds of rank 0 that the other ranks open through ``/proc/<pid>/fd``: nothing is
left in ``/dev/shm`` by a crash, and no volume has to be sized for it. Each bucket handed out
keeps its buffer busy until the last view of it is gone (a finalizer on the array under the
views); a busy buffer is never written, so a consumer may keep a bucket as long as it likes, at
the cost of a new buffer for the next bucket. A trainer that streams its versions drops each
bucket once it is sent, so two or three buffers serve every version.

A GPU trainer gathers with NCCL on the device, and ranks on several hosts share no memory:
both keep the all-gather (:func:`services.trainer.gather._all_gather_rows`).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import secrets
import socket
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from services.paramsync import memory_files
from services.trainer import distributed as D
from services.trainer.rows import Rows

log = logging.getLogger(__name__)

# Each tensor starts on this boundary inside a buffer, so a view of any dtype is aligned.
ALIGN_BYTES = 64
# Buffers are sized in whole MiB, so buckets a little larger than the last still fit.
SIZE_STEP = 1 << 20


@dataclass(frozen=True, slots=True)
class _Placed:
    """Where one row range's full bytes go inside a buffer, and this rank's part of them."""

    start: int
    nbytes: int
    # This rank's rows among them: their first byte inside the range, their first byte inside
    # the rank's shard, and how many bytes.
    own_offset: int
    local_offset: int
    own_nbytes: int


def _layout(parts: list[Rows], rank: int, world: int) -> tuple[list[_Placed], int]:
    """Each range's full bytes one after another, each start aligned, and this rank's rows of each
    (:meth:`Rows.own`)."""
    placed, position = [], 0
    for part in parts:
        local, inside, count = part.own(rank, world)
        row_bytes = part.row_bytes
        placed.append(_Placed(position, part.nbytes, inside * row_bytes, local * row_bytes, count * row_bytes))
        position += -(-part.nbytes // ALIGN_BYTES) * ALIGN_BYTES
    return placed, position


def buffer_bytes(parts: list[Rows]) -> int:
    """The buffer size that holds ``parts`` in full."""
    return _layout(parts, 0, 1)[1]


def _own_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local().detach().contiguous().view(torch.uint8).reshape(-1)


@dataclass(eq=False)
class _Buffer:
    """One memfd and this process's mapping of it."""

    index: int
    size: int
    map: mmap.mmap
    fd: int = -1  # rank 0 keeps it open: the other ranks open the buffer through it
    busy: bool = False

    def close(self) -> None:
        if self.fd >= 0:
            memory_files.unregister(_address(self.map))
            os.close(self.fd)
            self.fd = -1
        # BufferError: a view's array is still being torn down, and the mapping goes with it.
        with contextlib.suppress(BufferError):
            self.map.close()


def _create(index: int, size: int) -> _Buffer:
    fd = os.memfd_create(f"relayrl-gather-{index}", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        # Claims the pages now: writing through a mapping the kernel cannot back would be a SIGBUS.
        os.posix_fallocate(fd, 0, size)
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        # A bucket's upload may name this file rather than send its bytes (paramsync on this host).
        memory_files.register(_address(mapping), size, fd)
        return _Buffer(index, size, mapping, fd)
    except BaseException:
        os.close(fd)
        raise


def _address(mapping: mmap.mmap) -> int:
    return int(np.frombuffer(mapping, dtype=np.uint8, count=1).ctypes.data)


def _open_peer(pid: int, fd: int, index: int, size: int) -> _Buffer:
    peer = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    try:
        return _Buffer(index, size, mmap.mmap(peer, size, flags=mmap.MAP_SHARED))
    finally:
        os.close(peer)


class HostGather:
    """Row-sharded tensors gathered into buffers rank 0 shares with the other ranks of its host.

    Made by :meth:`connect` (collective), which returns None unless every rank can map rank 0's
    memory; then :meth:`gather` is collective like an all-gather, and gives rank 0 the full tensors.
    """

    def __init__(self, rank: int, world: int, rank0_pid: int) -> None:
        self.rank, self.world, self.rank0_pid = rank, world, rank0_pid
        self._buffers: dict[int, _Buffer] = {}
        self._next_index = 0
        self._lock = threading.Lock()

    @classmethod
    def connect(cls) -> HostGather | None:
        """Collective: a HostGather when every rank runs on rank 0's host and maps its memory, else None.

        Rank 0 writes a random token into a buffer; every rank must read it back through
        ``/proc/<rank 0's pid>/fd``, which also rules out a same-numbered process of another host.
        """
        rank, world = D.get_rank(), D.world_size()
        if world < 2:
            return None
        probe, token, reason = None, secrets.token_bytes(16), ""
        if rank == 0:
            try:
                probe = _create(-1, SIZE_STEP)
                probe.map[: len(token)] = token
            except OSError as exc:
                reason = f"cannot make a shared buffer: {exc}"
        try:
            host, pid, fd, token = D.broadcast_object(
                (socket.gethostname(), os.getpid(), probe.fd if probe else -1, token)
            )
            if rank != 0:
                reason = _read_token(host, pid, fd, token) if fd >= 0 else "rank 0 made no shared buffer"
            reasons = D.all_gather_objects(reason)
        finally:
            if probe is not None:
                probe.close()
        failed = [f"rank {r}: {why}" for r, why in enumerate(reasons) if why]
        if failed:
            if rank == 0:
                log.info("weights are gathered with an all-gather: %s", "; ".join(failed))
            return None
        return cls(rank, world, pid)

    def gather(self, parts: list[Rows], capacity: int) -> list[torch.Tensor] | None:
        """Collective: the full rows of the row-sharded ``parts`` on rank 0 (views of one buffer of
        at least ``capacity`` bytes, which every rank passes alike), [] elsewhere; None on every
        rank when rank 0 could not have a buffer (the caller gathers another way)."""
        placed, size = _layout(parts, self.rank, self.world)
        taken = (0, 0, 0)
        if self.rank == 0:
            try:
                taken = self._take(max(size, capacity))
            except OSError as exc:  # the other ranks wait in the broadcast: tell them
                log.warning("no shared buffer of %d bytes (%s): this bucket is all-gathered", size, exc)
                taken = (-1, 0, 0)
        index, fd, buffer_size = (int(v) for v in D.broadcast_tensor(torch.tensor(taken, dtype=torch.int64)))
        if index < 0:
            return None
        if self.rank != 0:
            # Rank 0 hands out no buffer smaller than this one again while it has one this size.
            for old in [b for b in self._buffers.values() if b.size < buffer_size]:
                self._buffers.pop(old.index).close()
            if index not in self._buffers:
                self._buffers[index] = _open_peer(self.rank0_pid, fd, index, buffer_size)
        buffer = self._buffers[index]
        array = np.frombuffer(buffer.map, dtype=np.uint8, count=max(size, 1))
        whole = torch.from_numpy(array)
        misfit = ""
        for part, where in zip(parts, placed, strict=True):
            own = _own_bytes(part.tensor)
            expected = part.shard_rows(self.rank, self.world) * part.row_bytes
            if own.numel() != expected:
                misfit = misfit or (
                    f"rank {self.rank} holds {own.numel()} bytes of a tensor of shape {tuple(part.tensor.shape)}, "
                    f"expected {expected} (rows split as torch.chunk)"
                )
                continue
            first = where.start + where.own_offset
            whole[first : first + where.own_nbytes].copy_(
                own[where.local_offset : where.local_offset + where.own_nbytes]
            )
        # The barrier after the writes, which also tells every rank whether one of them could not write.
        if D.all_reduce(torch.tensor([1 if misfit else 0])).item():
            if self.rank == 0:
                self._release(index)
            raise ValueError(misfit or "another rank's shards are not split as torch.chunk splits them")
        if self.rank != 0:
            return []
        # The views keep ``array`` alive: the buffer is free again once the last of them is gone.
        weakref.finalize(array, self._release, index)
        return [
            whole[where.start : where.start + where.nbytes].view(part.tensor.dtype).reshape(part.shape)
            for part, where in zip(parts, placed, strict=True)
        ]

    def _take(self, size: int) -> tuple[int, int, int]:
        """Rank 0: a free buffer of at least ``size`` bytes (made if none) as (index, fd, size); free
        buffers too small for it are closed (and the other ranks close theirs)."""
        with self._lock:
            for small in [b for b in self._buffers.values() if not b.busy and b.size < size]:
                self._buffers.pop(small.index).close()
            buffer = next((b for b in self._buffers.values() if not b.busy), None)
            if buffer is None:
                buffer = _create(self._next_index, -(-size // SIZE_STEP) * SIZE_STEP)
                self._buffers[buffer.index] = buffer
                self._next_index += 1
            buffer.busy = True
            return buffer.index, buffer.fd, buffer.size

    def _release(self, index: int) -> None:
        with self._lock:
            buffer = self._buffers.get(index)
            if buffer is not None:
                buffer.busy = False

    def buffers(self) -> int:
        """How many buffers this rank maps."""
        return len(self._buffers)


def _read_token(host: str, pid: int, fd: int, token: bytes) -> str:
    """Why this rank cannot map rank 0's memory ("" when it can)."""
    if host != socket.gethostname():
        return f"on host {socket.gethostname()!r}, rank 0 on {host!r}"
    try:
        peer = _open_peer(pid, fd, -1, SIZE_STEP)
    except OSError as exc:
        return f"cannot open rank 0's memory: {exc}"
    try:
        return "" if peer.map[: len(token)] == token else "rank 0's memory holds another token"
    finally:
        peer.close()
