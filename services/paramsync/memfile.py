"""A replica's versions as safetensors files received in place, for its engine to load by path.

The engine takes weights from a path (SGLang's ``/update_weights_from_disk``), so a version has
to become a file. Rather than receive it into memory and write a file from that, the replica
lays the file out first (the safetensors header follows from the manifest alone), maps it, and
the receive writes every tensor's bytes at its offset inside the mapping. Under ``/dev/shm``
(tmpfs) the file *is* memory, which the engine maps in turn: from the socket to the engine's
parameters the bytes are copied twice (into the file, then into the parameters), and nothing
touches a disk.

Layout of ``root``:

- ``v<version>/model.safetensors``: a version whose every tensor matched its checksum;
- ``.receiving-<version>.safetensors``: a version being received, outside any version
  directory, so no engine is ever given a half-received or corrupt file. It is renamed in
  only after the last checksum matched, and deleted if any did not.

A replica on paramsync's host maps a version instead (``channels/shared_memory.py``): the
version's directory then holds a link to paramsync's memory file, open in this process until a
newer version is loaded, and nothing is received.

Memory: the files of the newest ``keep`` versions stay, each with its mapping. A new version is
received into the oldest kept file the engine no longer reads (one older than the version the
engine holds: SGLang applies updates one at a time, so once a version is applied every older
file has been read), whose pages are already in: a fresh file costs ~0.45 s of page faults per
512 MiB, the whole loopback transfer about half that.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.paramsync.manifest import Manifest
from services.paramsync.safetensors_io import FILE_NAME, safetensors_header, version_dir

if TYPE_CHECKING:
    from services.paramsync.channels.shared_memory import MappedVersion


class VersionFileError(RuntimeError):
    """The file for a version could not be made (e.g. no room left in the shared-memory volume)."""


@dataclass
class _MappedFile:
    path: Path
    size: int
    map: mmap.mmap


def _map_new(path: Path, size: int) -> _MappedFile:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return _map_fd(fd, path, size)
    finally:
        os.close(fd)


def _map_fd(fd: int, path: Path, size: int) -> _MappedFile:
    os.ftruncate(fd, size)
    # Claims the pages now: writing through a mapping of a full tmpfs kills the process with
    # SIGBUS, where this raises ENOSPC.
    os.posix_fallocate(fd, 0, size)
    return _MappedFile(path, size, mmap.mmap(fd, size, flags=mmap.MAP_SHARED))


def _resized(file: _MappedFile, path: Path, size: int) -> _MappedFile:
    """``file`` moved to ``path`` with ``size`` bytes; its mapping kept when the size is unchanged."""
    os.replace(file.path, path)
    if file.size == size:
        return _MappedFile(path, size, file.map)
    fd = os.open(path, os.O_RDWR)
    try:
        return _map_fd(fd, path, size)
    finally:
        os.close(fd)


class VersionFiles:
    """The version files of one replica under ``root`` (emptied at start: a restarted replica's
    leftovers are no one's), keeping the newest ``keep``."""

    def __init__(self, root: Path, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.root = root
        self.keep = keep
        # Complete versions, oldest first; guarded by _lock, as receives run in worker threads.
        self._files: dict[int, _MappedFile] = {}
        # Versions mapped from paramsync's memory (only the newest is kept).
        self._mapped: dict[int, MappedVersion] = {}
        self._lock = threading.Lock()
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)

    def versions(self) -> list[int]:
        with self._lock:
            return sorted({*self._files, *self._mapped})

    def add_mapped(self, mapped: MappedVersion) -> Path:
        """Makes a version mapped from paramsync's memory loadable; returns its directory (the
        engine's model path), which holds a link to the memory file."""
        version = mapped.manifest.version
        directory = version_dir(self.root, version)
        with self._lock:
            self._drop(version)
            directory.mkdir()
            (directory / FILE_NAME).symlink_to(mapped.path)
            self._mapped[version] = mapped
        return directory

    @contextlib.contextmanager
    def receiving(self, reusable_below: int = 0) -> Iterator[Landing]:
        """A place for one version; unless :meth:`Landing.commit` was called, its file is deleted
        on leaving. Kept files older than ``reusable_below`` may be reused for it."""
        landing = Landing(self, reusable_below)
        try:
            yield landing
        finally:
            landing.abandon()

    def prune(self) -> None:
        """Deletes all but the newest ``keep`` received versions, and every mapped version but the
        newest version: no later version reuses a mapped one's memory, so the engine's is all."""
        with self._lock:
            newest = max((*self._files, *self._mapped), default=0)
            for version in [*sorted(self._files)[: -self.keep], *(v for v in self._mapped if v != newest)]:
                self._drop(version)

    def close(self) -> None:
        """Deletes every file, received or being received, and lets go of every mapped one."""
        with self._lock:
            self._files.clear()
            for mapped in self._mapped.values():
                mapped.close()
            self._mapped.clear()
            shutil.rmtree(self.root, ignore_errors=True)

    def _take(self, path: Path, size: int, reusable_below: int) -> _MappedFile:
        with self._lock:
            old = [v for v in sorted(self._files) if v < reusable_below]
            # Only a version beyond what is kept anyway is reused: the newest stay loadable.
            if old and len(self._files) >= self.keep:
                file = self._files.pop(old[0])
                with contextlib.suppress(OSError):
                    taken = _resized(file, path, size)
                    version_dir(self.root, old[0]).rmdir()
                    return taken
            return _map_new(path, size)

    def _add(self, version: int, file: _MappedFile) -> Path:
        directory = version_dir(self.root, version)
        with self._lock:
            directory.mkdir(exist_ok=True)
            # A version received again replaces its file; an engine reading the old one keeps its inode.
            self._files.pop(version, None)
            self._let_go_of_mapped(version)
            final = directory / FILE_NAME
            os.replace(file.path, final)
            self._files[version] = _MappedFile(final, file.size, file.map)
            self._files = dict(sorted(self._files.items()))
        return directory

    def _drop(self, version: int) -> None:
        self._files.pop(version, None)
        self._let_go_of_mapped(version)
        shutil.rmtree(version_dir(self.root, version), ignore_errors=True)

    def _let_go_of_mapped(self, version: int) -> None:
        mapped = self._mapped.pop(version, None)
        if mapped is not None:
            mapped.close()


class Landing:
    """Where one version's bytes land: :meth:`place` once the manifest is known, then the
    receive fills the views, then :meth:`commit` once every checksum matched."""

    def __init__(self, files: VersionFiles, reusable_below: int) -> None:
        self._files = files
        self._reusable_below = reusable_below
        self._file: _MappedFile | None = None
        self._version = 0
        self._views: list[memoryview] = []
        self._done = False
        # place runs in the receiving thread, abandon in the caller's: a cancelled receive must
        # not create a file after its landing was abandoned.
        self._lock = threading.Lock()

    def place(self, manifest: Manifest) -> list[memoryview]:
        """Makes the file with its header written; returns one writable view per tensor, in
        manifest order, at the tensor's offset in the file."""
        header = safetensors_header(manifest)
        data_start = 8 + len(header)
        path = self._files.root / f".receiving-{manifest.version}.safetensors"
        with self._lock:
            if self._done or self._file is not None:
                raise VersionFileError(f"the landing of version {manifest.version} is closed or already placed")
            try:
                file = self._files._take(path, data_start + manifest.total_bytes, self._reusable_below)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    path.unlink()
                raise VersionFileError(f"no file for version {manifest.version} in {self._files.root}: {exc}") from exc
            self._file, self._version = file, manifest.version
            file.map[:8] = struct.pack("<Q", len(header))
            file.map[8:data_start] = header
            whole = memoryview(file.map)
            self._views = [
                whole[data_start + start : data_start + start + spec.num_bytes]
                for spec, start in zip(manifest.tensors, manifest.offsets(), strict=True)
            ]
            whole.release()
            return list(self._views)

    def commit(self) -> Path:
        """Makes the received version loadable; returns its directory (the engine's model path)."""
        with self._lock:
            if self._file is None or self._done:
                raise VersionFileError("commit before place, or after abandon")
            self._done = True
            self._release_views()
            return self._files._add(self._version, self._file)

    def abandon(self) -> None:
        """Deletes the file unless committed. Its mapping is left to the garbage collector: a
        cancelled receive thread may still be writing into it."""
        with self._lock:
            if self._done:
                return
            self._done = True
            self._views = []
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.path.unlink()
                self._file = None

    def _release_views(self) -> None:
        for view in self._views:
            view.release()
        self._views = []
