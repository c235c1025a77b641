"""The memory a version's bytes are received into, kept ready so that receiving never waits on it.

A fresh buffer costs more than moving the bytes: CPython zero-fills a new ``bytearray`` and the
kernel then faults each 4 KiB page in, about 0.45 s per 512 MiB on the 2-core CI machine, where
loopback TCP moves 512 MiB in 0.23 s. So memory is prepared off the transfer's path:

- paramsync recycles the memory of the version it just evicted (see ``VersionStore``);
- a replica's client faults a spare buffer in from a thread after each fetch
  (:class:`SpareMemory`), ready for the next version.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import mmap

log = logging.getLogger(__name__)

# Linux ≥ 5.14: fault every page in now. Python 3.11's mmap module does not name it, and its
# madvise holds the GIL, so it is called through ctypes (which releases the GIL).
MADV_POPULATE_WRITE = 23
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class VersionMemory:
    """``size`` writable bytes (``view``) in a private anonymous mapping."""

    def __init__(self, size: int) -> None:
        self.size = size
        # mmap refuses length 0; an empty version still gets a (one-byte) mapping.
        self.map = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.view = memoryview(self.map)[:size]

    def populate(self) -> None:
        """Faults every page in (blocking, without the GIL), so later writes run at memory speed."""
        anchor = ctypes.c_char.from_buffer(self.map)
        try:
            if _libc.madvise(ctypes.addressof(anchor), len(self.map), MADV_POPULATE_WRITE) != 0:
                # Older kernels: the pages fault in on first write instead.
                log.debug("MADV_POPULATE_WRITE failed with errno %d", ctypes.get_errno())
        finally:
            del anchor


class SpareMemory:
    """At most one pre-faulted buffer waiting for the next fetch."""

    def __init__(self) -> None:
        self._ready: VersionMemory | None = None
        self._preparing: asyncio.Task[None] | None = None

    def take(self, size: int) -> VersionMemory:
        """The spare if it is ready and has exactly ``size`` bytes, else fresh (unfaulted) memory."""
        spare, self._ready = self._ready, None
        if spare is not None and spare.size == size:
            return spare
        return VersionMemory(size)

    def prepare(self, size: int) -> None:
        """Starts faulting in a ``size``-byte buffer in a thread, unless one is ready or under way."""
        if self._preparing is not None and not self._preparing.done():
            return
        if self._ready is not None and self._ready.size == size:
            return
        self._preparing = asyncio.create_task(self._prepare(size), name="paramsync-spare-memory")

    def discard(self) -> None:
        """Drops the spare and stops waiting for one being prepared."""
        if self._preparing is not None:
            self._preparing.cancel()
        self._ready = None

    async def _prepare(self, size: int) -> None:
        memory = VersionMemory(size)
        await asyncio.to_thread(memory.populate)
        self._ready = memory
