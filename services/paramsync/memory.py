"""The memory a version's bytes are received into, reused so that receiving never waits on it.

A fresh buffer costs more than moving the bytes: CPython zero-fills a new ``bytearray`` and the
kernel then faults each 4 KiB page in, about 0.45 s per 512 MiB on the 2-core CI machine, where
loopback TCP moves 512 MiB in 0.23 s. Memory that already held a version has its pages in, so:

- paramsync reuses the memory of the version it just evicted, unless something still reads it
  (``VersionStore``);
- a replica's client reuses the memory of the version it fetched before, once the caller has
  dropped every tensor of it.

Both keep that memory in a :class:`RecycledMemory`.
"""

from __future__ import annotations

import mmap


class VersionMemory:
    """``size`` writable bytes (``view``) in a private anonymous mapping."""

    def __init__(self, size: int) -> None:
        self.size = size
        # mmap refuses length 0; an empty version still gets a (one-byte) mapping.
        self.map = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.view = memoryview(self.map)[:size]


class RecycledMemory:
    """At most one buffer whose version nobody uses any more, kept for the next version."""

    def __init__(self) -> None:
        self._free: VersionMemory | None = None

    def take(self, size: int) -> VersionMemory:
        """The kept buffer if it has exactly ``size`` bytes, else fresh memory."""
        free, self._free = self._free, None
        return free if free is not None and free.size == size else VersionMemory(size)

    def give_back(self, memory: VersionMemory) -> None:
        """Keeps ``memory``, which nothing uses any more; may be called from any thread."""
        self._free = memory

    def discard(self) -> None:
        self._free = None
