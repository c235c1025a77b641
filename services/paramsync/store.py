"""The versioned weight store: the last K complete versions plus at most one upload in progress.

Each version is one buffer (:class:`~services.paramsync.memory.VersionMemory`) holding its
tensors back to back in manifest order, so an upload writes every byte once and fetchers slice
it without further copies. Readers of a version that is still uploading wait on
:meth:`StoredVersion.wait_past` and receive bytes as they arrive; that is how chunks are
forwarded before the upload finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from services.paramsync.digest import Hasher, new_hasher
from services.paramsync.manifest import Manifest
from services.paramsync.memory import RecycledMemory, VersionMemory
from services.paramsync.wire import encode_chunk

# Serialized Fetch chunks kept per version. Replicas fetching together read the same chunks at
# about the same time, so each chunk is serialized once however many replicas there are.
SERIALIZED_CHUNKS_KEPT = 8


class VersionState(enum.Enum):
    UPLOADING = "uploading"
    COMPLETE = "complete"
    FAILED = "failed"


class StoreError(Exception):
    """A refused operation; ``reason`` names it (a metrics label, and what
    :func:`services.paramsync.errors.status_of` maps to a gRPC status)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(eq=False)
class StoredVersion:
    manifest: Manifest
    memory: VersionMemory
    state: VersionState = VersionState.UPLOADING
    received: int = 0
    error: str = ""
    # Fetches, disk writes and broadcasts reading ``data`` right now (see ``reading``).
    readers: int = 0
    published_at_unix_s: float = field(default_factory=time.time)
    _progress: asyncio.Event = field(default_factory=asyncio.Event)
    _serialized: OrderedDict[tuple[int, int], bytes] = field(default_factory=OrderedDict)
    _offsets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._offsets = self.manifest.offsets()

    @classmethod
    def empty(cls, manifest: Manifest) -> StoredVersion:
        return cls(manifest, VersionMemory(manifest.total_bytes))

    @property
    def data(self) -> memoryview:
        """The version's bytes, tensors back to back in manifest order (writable while uploading)."""
        return self.memory.view

    @property
    def version(self) -> int:
        return self.manifest.version

    @contextlib.contextmanager
    def reading(self) -> Iterator[memoryview]:
        """Marks a use of the bytes, so the store never recycles this memory under a reader."""
        self.readers += 1
        try:
            yield self.data
        finally:
            self.readers -= 1

    def pulse(self) -> None:
        """Wakes every reader waiting for more bytes or for the upload to end."""
        self._progress.set()
        self._progress = asyncio.Event()

    async def wait_past(self, position: int, timeout_s: float) -> None:
        """Returns once more than ``position`` bytes arrived or the upload ended; TimeoutError if neither."""
        while self.received <= position and self.state is VersionState.UPLOADING:
            event = self._progress
            await asyncio.wait_for(event.wait(), timeout_s)

    def serialized_chunk(self, index: int, offset: int, stop: int) -> bytes:
        """The Fetch message for bytes ``[offset, stop)`` of tensor ``index``, serialized once and shared."""
        key = (index, offset)
        cached = self._serialized.get(key)
        if cached is None:
            spec, start = self.manifest.tensors[index], self._offsets[index]
            data = self.data[start + offset : start + stop]
            cached = self._serialized[key] = encode_chunk(spec.name, offset, data)
            while len(self._serialized) > SERIALIZED_CHUNKS_KEPT:
                self._serialized.popitem(last=False)
        return cached


class UploadWriter:
    """Accepts one upload's chunks in manifest order, checking offsets, sizes and checksums."""

    def __init__(self, stored: StoredVersion) -> None:
        self.stored = stored
        self._offsets = stored.manifest.offsets()
        self._index = 0
        self._filled = 0
        self._hasher: Hasher = new_hasher(stored.manifest.checksum_algorithm)

    def _skip_finished(self) -> None:
        tensors = self.stored.manifest.tensors
        while self._index < len(tensors) and self._filled == tensors[self._index].num_bytes:
            spec = tensors[self._index]
            if self._hasher.hexdigest() != spec.checksum:
                raise StoreError(
                    "checksum",
                    f"version {self.stored.version}: tensor {spec.name!r} does not match its"
                    f" {self.stored.manifest.checksum_algorithm} checksum",
                )
            self._index, self._filled = self._index + 1, 0
            self._hasher = new_hasher(self.stored.manifest.checksum_algorithm)

    def accept(self, tensor_name: str, offset: int, data: bytes | memoryview) -> None:
        self._skip_finished()
        tensors = self.stored.manifest.tensors
        expected = tensors[self._index].name if self._index < len(tensors) else None
        if tensor_name != expected or offset != self._filled:
            raise StoreError(
                "out_of_order",
                f"version {self.stored.version}: expected {expected!r} at offset {self._filled},"
                f" got {tensor_name!r} at offset {offset}",
            )
        spec = tensors[self._index]
        if self._filled + len(data) > spec.num_bytes:
            raise StoreError("overflow", f"chunk of {tensor_name!r} runs past its {spec.num_bytes} bytes")
        start = self._offsets[self._index] + self._filled
        self.stored.data[start : start + len(data)] = data
        self.check_in_place(start, len(data))
        self.stored.received += len(data)
        self.stored.pulse()

    def check_in_place(self, position: int, nbytes: int) -> None:
        """Hashes ``nbytes`` already in the version's memory at ``position``.

        They follow the bytes checked so far (both uploads arrive in manifest order) and tensor
        boundaries may fall anywhere inside them. Only the hashers change, not the version, so
        the data plane's receiving thread calls this; the loop then publishes the progress
        (``stored.received``).
        """
        end = position + nbytes
        if end > self.stored.manifest.total_bytes:
            raise StoreError(
                "overflow",
                f"upload of version {self.stored.version} runs past its {self.stored.manifest.total_bytes} bytes",
            )
        tensors, data = self.stored.manifest.tensors, self.stored.data
        while position < end:
            self._skip_finished()
            tensor_end = self._offsets[self._index] + tensors[self._index].num_bytes
            take = min(end, tensor_end) - position
            self._hasher.update(data[position : position + take])
            self._filled += take
            position += take
        self._skip_finished()

    def finish(self) -> None:
        self._skip_finished()
        if self.stored.received != self.stored.manifest.total_bytes:
            raise StoreError(
                "incomplete",
                f"version {self.stored.version}: upload ended after {self.stored.received} of"
                f" {self.stored.manifest.total_bytes} bytes",
            )


class VersionStore:
    """Decides which uploads are accepted and which versions are served."""

    def __init__(self, keep_versions: int) -> None:
        self.keep_versions = keep_versions
        self._complete: dict[int, StoredVersion] = {}
        self.uploading: StoredVersion | None = None
        # The memory of the last evicted version, reused by the next upload of the same size:
        # fresh memory costs about 0.45 s of page faults per 512 MiB on the upload's path.
        self._recycled = RecycledMemory()

    @property
    def latest(self) -> StoredVersion | None:
        return self._complete[max(self._complete)] if self._complete else None

    @property
    def latest_version(self) -> int:
        return max(self._complete, default=0)

    def versions(self) -> list[int]:
        return sorted(self._complete)

    def begin(self, manifest: Manifest) -> StoredVersion | None:
        """Starts an upload; None means the same bytes are already the latest version (idempotent)."""
        latest = self.latest
        if latest is not None and manifest.version <= latest.version:
            if manifest.version == latest.version and latest.manifest.same_content(manifest):
                return None
            raise StoreError(
                "not_newer",
                f"version {manifest.version} is not newer than the latest version {latest.version}"
                + (" and its content differs" if manifest.version == latest.version else ""),
            )
        if self.uploading is not None:
            if manifest.version < self.uploading.version:
                raise StoreError(
                    "not_newer",
                    f"version {manifest.version} is older than version {self.uploading.version} being uploaded",
                )
            # Only a restarted trainer re-sends while an upload is open; its new stream wins.
            self.fail(self.uploading, f"superseded by a new upload of version {manifest.version}")
        self.uploading = StoredVersion(manifest, self._recycled.take(manifest.total_bytes))
        return self.uploading

    def commit(self, stored: StoredVersion) -> None:
        stored.state = VersionState.COMPLETE
        self._complete[stored.version] = stored
        if self.uploading is stored:
            self.uploading = None
        for old in sorted(self._complete)[: -self.keep_versions]:
            evicted = self._complete.pop(old)
            if evicted.readers == 0:
                self._recycled.give_back(evicted.memory)
        stored.pulse()

    def fail(self, stored: StoredVersion, reason: str) -> None:
        stored.state = VersionState.FAILED
        stored.error = reason
        if self.uploading is stored:
            self.uploading = None
        stored.pulse()

    def restore(self, stored: StoredVersion) -> None:
        """Adds a version read back from disk at start-up."""
        stored.received = stored.manifest.total_bytes
        self.commit(stored)

    def get(self, version: int) -> StoredVersion:
        """Version ``version`` (0: the latest complete one), complete or still uploading."""
        if version == 0:
            if self.latest is None:
                raise StoreError("not_found", "no version has been published yet")
            return self.latest
        if version in self._complete:
            return self._complete[version]
        if self.uploading is not None and self.uploading.version == version:
            return self.uploading
        raise StoreError(
            "not_found",
            f"version {version} is not held; held: {self.versions() or 'none'}"
            + (f", uploading {self.uploading.version}" if self.uploading else ""),
        )
