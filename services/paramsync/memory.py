"""The memory a version's bytes are received into, reused so that receiving never waits on it.

A fresh buffer costs more than moving the bytes: CPython zero-fills a new ``bytearray`` and the
kernel then faults each 4 KiB page in, about 0.45 s per 512 MiB on the 2-core CI machine, where
loopback TCP moves 512 MiB in 0.23 s. Memory that already held a version has its pages in, so:

- paramsync reuses the memory of the version it just evicted, unless something still reads it
  (``VersionStore``);
- a replica's client reuses the memory of the version it fetched before, once the caller has
  dropped every tensor of it.

Both keep that memory in a :class:`RecycledMemory`.

Paramsync's versions live in memory files (``memfd``) laid out as safetensors files: the header
first, written when the upload begins (it names the tensors and offsets, not their checksums,
which may arrive with the bytes), then the tensors back to back. A replica on the same host then
opens the file through ``/proc/<pid>/fd/<fd>`` and hands its engine a path instead of receiving a
copy (see ``channels/shared_memory.py``).
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import struct
import weakref

from services.paramsync.manifest import Manifest

# Tensors start on a page boundary of the file, so an engine mapping it views them aligned.
PAGE_BYTES = mmap.PAGESIZE
# The widest version number a header must leave room for (an int64).
_WIDEST_VERSION = 2**63 - 1
TOKEN_KEY = "relayrl_memory_token"
# Without memory files (not Linux) versions live in private memory and are never shared.
SHARES_MEMORY = hasattr(os, "memfd_create")


class VersionMemory:
    """``size`` writable bytes (``view``) in a private anonymous mapping."""

    prefix = 0

    def __init__(self, size: int) -> None:
        self.size = size
        # mmap refuses length 0; an empty version still gets a (one-byte) mapping.
        self.map = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.view = memoryview(self.map)[:size]


class SharedVersionMemory(VersionMemory):
    """``size`` writable bytes (``view``) after a ``prefix`` of header room, in a memory file
    (``fd``) that other processes of this host may open; ``token`` identifies it in the header."""

    def __init__(self, size: int, prefix: int) -> None:
        self.size, self.prefix = size, prefix
        self.token = secrets.token_hex(16)
        self.fd = os.memfd_create("relayrl-version", os.MFD_CLOEXEC)
        self._closer = weakref.finalize(self, os.close, self.fd)
        os.ftruncate(self.fd, prefix + size)
        # Claims the pages now: a lack of memory is ENOSPC here, not SIGBUS at the first write.
        os.posix_fallocate(self.fd, 0, prefix + size)
        self.map = mmap.mmap(self.fd, prefix + size, flags=mmap.MAP_SHARED)
        self.view = memoryview(self.map)[prefix : prefix + size]

    @property
    def file_bytes(self) -> int:
        return self.prefix + self.size

    def write_header(self, manifest: Manifest) -> None:
        """Makes the file a safetensors file of ``manifest``'s tensors, whatever their bytes."""
        header = layout_header(manifest, manifest.version, self.token)
        room = self.prefix - 8
        self.map[:8] = struct.pack("<Q", room)
        # safetensors allows a header padded with spaces (it pads its own to 8 bytes).
        self.map[8 : self.prefix] = header + b" " * (room - len(header))


def layout_header(manifest: Manifest, version: int, token: str) -> bytes:
    """The safetensors header of ``manifest``'s tensors back to back, with the version and the
    memory's token as metadata (no checksums: they may not be known yet)."""
    header = manifest.safetensors_entries()
    header["__metadata__"] = {"format": "pt", "relayrl_version": str(version), TOKEN_KEY: token}
    return json.dumps(header, separators=(",", ":")).encode()


def header_room(manifest: Manifest) -> int:
    """Bytes before the tensors in a shared version's file: the length field and the header of
    any version with this layout, rounded up to a page."""
    header = layout_header(manifest, _WIDEST_VERSION, secrets.token_hex(16))
    return -(-(8 + len(header)) // PAGE_BYTES) * PAGE_BYTES


def new_memory(size: int, prefix: int = 0) -> VersionMemory:
    """Shared memory with ``prefix`` bytes of header room where asked (see :data:`SHARES_MEMORY`),
    else a private mapping."""
    return SharedVersionMemory(size, prefix) if prefix and SHARES_MEMORY else VersionMemory(size)


class RecycledMemory:
    """At most one buffer whose version nobody uses any more, kept for the next version."""

    def __init__(self) -> None:
        self._free: VersionMemory | None = None

    def take(self, size: int, prefix: int = 0) -> VersionMemory:
        """The kept buffer if it has exactly ``size`` bytes after a ``prefix``, else fresh memory."""
        free, self._free = self._free, None
        if free is not None and free.size == size and free.prefix == (prefix if SHARES_MEMORY else 0):
            return free
        return new_memory(size, prefix)

    def give_back(self, memory: VersionMemory) -> None:
        """Keeps ``memory``, which nothing uses any more; may be called from any thread."""
        self._free = memory

    def discard(self) -> None:
        self._free = None
