"""The versioned weight store: the last K complete versions plus at most one upload in progress.

Each version is one buffer (:class:`~services.paramsync.memory.VersionMemory`) holding its
tensors back to back in manifest order, so an upload writes every byte once and fetchers slice
it without further copies. The buffer is a memory file laid out as a safetensors file, which a
replica on this host may map instead of fetching (``channels/shared_memory.py``); memory handed
out that way is never written again until the replica reports holding a newer version, since its
engine may serve the file in place. Readers of a version that is still uploading wait on
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
from services.paramsync.manifest import Manifest, WeightHandles
from services.paramsync.memory import RecycledMemory, SharedVersionMemory, VersionMemory, header_room, new_memory
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
    # Replicas that mapped this version's memory and have not yet reported a newer version.
    mapped_by: set[str] = field(default_factory=set)
    published_at_unix_s: float = field(default_factory=time.time)
    # Set for a re-publish of the latest version: its checksums are compared with these, and the
    # upload never becomes a version of its own.
    republish_of: Manifest | None = None
    # The upload's writer; kept while a broken link may still be resumed.
    writer: UploadWriter | None = None
    # Increases whenever the trainer's link to this upload breaks or comes back (see core).
    link_epoch: int = 0
    # The trainer's handles to the same tensors on its host, announced with the version.
    handles: WeightHandles | None = None
    _progress: asyncio.Event = field(default_factory=asyncio.Event)
    _serialized: OrderedDict[tuple[int, int], bytes] = field(default_factory=OrderedDict)
    _offsets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._offsets = self.manifest.offsets()

    @classmethod
    def empty(cls, manifest: Manifest, recycled: RecycledMemory | None = None) -> StoredVersion:
        """A version of ``manifest`` with room for its bytes (``recycled``'s kept buffer if it fits)."""
        prefix = header_room(manifest)
        memory = recycled.take(manifest.total_bytes, prefix) if recycled else new_memory(manifest.total_bytes, prefix)
        if isinstance(memory, SharedVersionMemory):
            memory.write_header(manifest)
        return cls(manifest, memory)

    @property
    def in_use(self) -> bool:
        """Whether anything may still read the memory: a reader, or a replica's engine that mapped it."""
        return self.readers > 0 or bool(self.mapped_by)

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

    def advance(self, position: int) -> None:
        """Records that bytes up to ``position`` are in memory; a resumed upload never moves it back."""
        self.received = max(self.received, position)
        self.pulse()

    def pulse(self) -> None:
        """Wakes every reader waiting for more bytes or for the upload to end."""
        self._progress.set()
        self._progress = asyncio.Event()

    async def wait_past(self, position: int, timeout_s: float) -> None:
        """Returns once more than ``position`` bytes arrived or the upload ended; TimeoutError if neither."""
        while self.received <= position and self.state is VersionState.UPLOADING:
            event = self._progress
            await asyncio.wait_for(event.wait(), timeout_s)

    async def wait_ended(self, timeout_s: float) -> bool:
        """Waits for the upload's end (its last bytes may be verified after they arrived), each
        wait for progress bounded by ``timeout_s``; True when the version was committed."""
        while self.state is VersionState.UPLOADING:
            await self.wait_past(self.manifest.total_bytes, timeout_s)
        return self.state is VersionState.COMPLETE

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
    """Accepts one upload's bytes in manifest order, checking offsets, sizes and checksums.

    With an open manifest (a streamed upload) each tensor's checksum arrives through
    :meth:`add_checksums` before its last byte; a tensor is verified as its last byte lands. The
    writer outlives a broken link, so a resumed upload goes on from a verified tensor boundary, or
    from the start of the last run (:meth:`begin_run`), which may lie inside a tensor larger than
    the trainer's bucket (:meth:`rewind`).
    """

    def __init__(self, stored: StoredVersion) -> None:
        self.stored = stored
        manifest = stored.manifest
        self._offsets = manifest.offsets()
        self.checksums: list[str] = [] if manifest.is_open else [t.checksum for t in manifest.tensors]
        self._index = 0
        self._filled = 0
        self._hasher: Hasher = new_hasher(manifest.checksum_algorithm)
        # Where the last run began inside a tensor, and the hash of that tensor's bytes before it.
        self._run_start: tuple[int, int, int, Hasher] | None = None

    @property
    def position(self) -> int:
        """Bytes written in order so far."""
        if self._index >= len(self._offsets):
            return self.stored.manifest.total_bytes
        return self._offsets[self._index] + self._filled

    @property
    def verified_bytes(self) -> int:
        """Bytes of the tensors verified so far (a tensor boundary)."""
        return self._offsets[self._index] if self._index < len(self._offsets) else self.stored.manifest.total_bytes

    def add_checksums(self, first_tensor: int, checksums: list[str]) -> None:
        """The checksums of tensors ``first_tensor, ...``; a resumed upload may send some again, unchanged."""
        tensors = self.stored.manifest.tensors
        if not self.stored.manifest.is_open:
            raise StoreError("bad_message", "checksums sent for an upload whose manifest already has them")
        if not 0 <= first_tensor <= len(self.checksums) or first_tensor + len(checksums) > len(tensors):
            raise StoreError(
                "bad_message",
                f"version {self.stored.version}: checksums for tensors {first_tensor}..{first_tensor + len(checksums)}"
                f" do not follow the {len(self.checksums)} known of {len(tensors)}",
            )
        for i, checksum in enumerate(checksums, start=first_tensor):
            if not checksum:
                raise StoreError("bad_message", f"tensor {tensors[i].name!r}: empty checksum")
            if i < len(self.checksums):
                if self.checksums[i] != checksum:
                    raise StoreError("checksum", f"tensor {tensors[i].name!r}: checksum changed on resume")
            else:
                self.checksums.append(checksum)
        republished = self.stored.republish_of
        if republished is not None:
            for spec, checksum in zip(republished.tensors, self.checksums, strict=False):
                if spec.checksum != checksum:
                    raise StoreError(
                        "not_newer",
                        f"version {self.stored.version} is not newer than the latest version"
                        f" {republished.version} and its content differs (tensor {spec.name!r})",
                    )

    def begin_run(self) -> None:
        """A run of the upload starts at :attr:`position`: a resumed upload may start there again,
        inside a tensor, since the hash of that tensor's bytes before it is kept."""
        self._skip_finished()
        mark = (self.position, self._index, self._filled, self._hasher.copy())
        self._run_start = mark if self._filled else None

    def rewind(self, position: int) -> None:
        """Goes back to ``position``: a tensor boundary no further than the verified bytes, where the
        last run began, or where the bytes in order end."""
        total = self.stored.manifest.total_bytes
        if position == self.position:
            return
        mark = self._run_start
        if mark is not None and mark[0] == position and position < self.position:
            _, self._index, self._filled, hasher = mark
            self._hasher = hasher.copy()
            return
        if position > self.verified_bytes or (position < total and position not in self._offsets):
            raise StoreError(
                "cannot_resume",
                f"version {self.stored.version}: cannot resume at byte {position}; paramsync verified"
                f" {self.verified_bytes} bytes (resume at a tensor boundary no further than that, or where"
                " the last run began)",
            )
        # Zero-byte tensors share their offset with the next one: start at the first of them.
        self._index = self._offsets.index(position) if position < total else len(self._offsets)
        self._filled = 0
        self._hasher = new_hasher(self.stored.manifest.checksum_algorithm)

    def _skip_finished(self) -> None:
        tensors = self.stored.manifest.tensors
        while self._index < len(tensors) and self._filled == tensors[self._index].num_bytes:
            spec = tensors[self._index]
            if self._index >= len(self.checksums):
                raise StoreError(
                    "bad_message", f"version {self.stored.version}: bytes of {spec.name!r} came before its checksum"
                )
            if self._hasher.hexdigest() != self.checksums[self._index]:
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
        self.stored.advance(self.position)

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

    def finish(self) -> Manifest:
        """The complete manifest, once every byte arrived and every tensor is verified."""
        self._skip_finished()
        if self.position != self.stored.manifest.total_bytes:
            raise StoreError(
                "incomplete",
                f"version {self.stored.version}: upload ended after {self.position} of"
                f" {self.stored.manifest.total_bytes} bytes",
            )
        return self.stored.manifest.with_checksums(self.checksums)


class VersionStore:
    """Decides which uploads are accepted and which versions are served."""

    def __init__(self, keep_versions: int) -> None:
        self.keep_versions = keep_versions
        self._complete: dict[int, StoredVersion] = {}
        self.uploading: StoredVersion | None = None
        # The memory of the last evicted version, reused by the next upload of the same size:
        # fresh memory costs about 0.45 s of page faults per 512 MiB on the upload's path.
        self._recycled = RecycledMemory()
        # The newest evicted version still in use, recycled once nothing uses it. One is enough:
        # one recycled buffer is all the next upload takes, and older ones' memory is freed once
        # their users let go of it.
        self._evicted: StoredVersion | None = None

    @property
    def latest(self) -> StoredVersion | None:
        return self._complete[max(self._complete)] if self._complete else None

    @property
    def latest_version(self) -> int:
        return max(self._complete, default=0)

    def versions(self) -> list[int]:
        return sorted(self._complete)

    def begin(self, manifest: Manifest, resume_from: int = 0) -> StoredVersion | None:
        """Starts an upload, or resumes the open one of the same version and tensors from byte
        ``resume_from``; None means the same bytes are already the latest version (idempotent)."""
        latest = self.latest
        if latest is not None and manifest.version <= latest.version:
            same_layout = manifest.layout() == latest.manifest.layout()
            if manifest.version == latest.version and manifest.is_open and same_layout:
                # The checksums come with the bytes: compare them as they arrive (UploadWriter).
                stored = StoredVersion.empty(manifest)
                stored.republish_of = latest.manifest
                stored.writer = UploadWriter(stored)
                stored.writer.rewind(resume_from)
                return stored
            if manifest.version == latest.version and latest.manifest.same_content(manifest):
                return None
            raise StoreError(
                "not_newer",
                f"version {manifest.version} is not newer than the latest version {latest.version}"
                + (" and its content differs" if manifest.version == latest.version else ""),
            )
        open_upload = self.uploading
        if open_upload is not None:
            if manifest.version < open_upload.version:
                raise StoreError(
                    "not_newer",
                    f"version {manifest.version} is older than version {open_upload.version} being uploaded",
                )
            same_layout = manifest.layout() == open_upload.manifest.layout()
            if resume_from and manifest.version == open_upload.version and same_layout:
                assert open_upload.writer is not None
                open_upload.writer.rewind(resume_from)
                return open_upload
            # Only a restarted trainer re-sends while an upload is open; its new stream wins.
            self.fail(open_upload, f"superseded by a new upload of version {manifest.version}")
        if resume_from:
            raise StoreError("cannot_resume", f"version {manifest.version}: no open upload to resume")
        self.uploading = StoredVersion.empty(manifest, self._recycled)
        self.uploading.writer = UploadWriter(self.uploading)
        return self.uploading

    def commit(self, stored: StoredVersion, manifest: Manifest | None = None) -> None:
        """Makes ``stored`` a complete version; ``manifest`` is its closed manifest when it was open."""
        if manifest is not None:
            stored.manifest = manifest
        stored.writer = None
        stored.state = VersionState.COMPLETE
        self._complete[stored.version] = stored
        if self.uploading is stored:
            self.uploading = None
        for old in sorted(self._complete)[: -self.keep_versions]:
            evicted = self._complete.pop(old)
            if evicted.in_use:
                self._evicted = evicted
            else:
                self._recycled.give_back(evicted.memory)
        stored.pulse()

    def release_mappings(self, replica_id: str, held_version: int) -> None:
        """``replica_id`` holds ``held_version`` now, so its engine no longer reads any older
        version's memory; an evicted version nothing else uses is recycled."""
        evicted = [self._evicted] if self._evicted is not None else []
        for stored in (*self._complete.values(), *evicted):
            if stored.version < held_version:
                stored.mapped_by.discard(replica_id)
        if self._evicted is not None and not self._evicted.in_use:
            self._recycled.give_back(self._evicted.memory)
            self._evicted = None

    def fail(self, stored: StoredVersion, reason: str) -> None:
        stored.writer = None
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
