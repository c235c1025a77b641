"""The client every other service uses: the trainer publishes, rollout replicas subscribe and fetch.

Trainer side::

    async with ParamSyncClient("paramsync:50060") as ps:
        await ps.publish(version, model.state_dict(), trainer_step=step)

Replica side::

    async with ParamSyncClient(address) as ps:
        async for ann in ps.subscribe("rollout-0", held_version, engine_url):
            if ann.transport == "grpc":
                weights = await ps.fetch(ann.version)     # verified against the manifest
                ...apply to the engine...
                # or, for an engine that loads a path: received straight into a safetensors file
                path = await ps.fetch_to_file(ann.version, VersionFiles(Path("/dev/shm/replica")))
            await ps.report_version("rollout-0", ann.version, ok=True, sync_s=elapsed)

Weights travel over one of two byte channels (:mod:`services.paramsync.channels`), both behind
the one ``ByteChannel`` interface: paramsync's bulk data plane (``tcp``, plain TCP, see
``BulkRequest`` in the proto) when it serves one, else the Publish and Fetch gRPC streams
(``grpc_chunks``); ``data_plane=False`` forces gRPC. If the data plane does not accept a
connection the call falls back to gRPC with a warning.

Failures raise :mod:`services.paramsync.errors` types: ``VersionConflict`` (an older or
different version), ``ChecksumMismatch`` (corrupt or missing bytes; nothing is returned),
``VersionUnavailable`` (not held, or its upload failed). A replica on paramsync's own host maps
each version's memory instead of fetching its bytes (``fetch_to_file``, the ``shared_memory``
channel), unless ``shared_memory=False``. Link failures (UNAVAILABLE,
DEADLINE_EXCEEDED) are retried with exponential backoff using verl's names:
``max_sync_retries`` attempts after the first, starting ``sync_retry_delay`` seconds apart, each
call bounded by ``sync_timeout`` seconds (an upload: each of its exchanges, as it also waits on
the trainer's gather). torch is imported only inside the calls that need it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from relayrl import threads
from relayrl.retry import RetryPolicy, call_with_retries, retrying
from relayrl.serving import grpc_channel
from relayrl.v1 import paramsync_pb2 as pb
from relayrl.v1 import paramsync_pb2_grpc as pb_grpc
from services.paramsync import memory_files
from services.paramsync.channels import shared_memory as shm
from services.paramsync.channels import tcp
from services.paramsync.channels.base import ByteChannel, TensorRun
from services.paramsync.channels.dataplane import DataPlaneAddress, DataPlaneUnreachable
from services.paramsync.channels.grpc_chunks import GrpcChunksChannel, stream_calls
from services.paramsync.channels.tcp import TcpChannel
from services.paramsync.digest import DEFAULT_ALGORITHM, new_hasher
from services.paramsync.errors import (
    TRANSIENT_CODES,
    from_rpc_error,
    is_transient,
    sync_retry_policy,
)
from services.paramsync.manifest import Announcement, Manifest, ReplicaVersion, TensorSpec, WeightHandles
from services.paramsync.memfile import VersionFiles
from services.paramsync.memory import RecycledMemory

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PublishResult:
    version: int
    # Bytes paramsync stored; 0 when the same version was already held (idempotent re-publish).
    bytes_received: int
    total_bytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class FetchedVersion:
    manifest: Manifest
    tensors: dict[str, torch.Tensor]


@dataclass(frozen=True, slots=True)
class VersionTable:
    latest_version: int
    replicas: list[ReplicaVersion]


def _host_of(address: str) -> str:
    """The host part of a gRPC target such as ``paramsync:50060``, ``dns:///h:1`` or ``[::1]:50060``."""
    target = address.rpartition("///")[2] if "///" in address else address
    return target.rpartition(":")[0].strip("[]") or target


class _NothingNew(Exception):
    """A subscription ended before announcing a new version: reconnect after the backoff."""


def _dropped(exc: BaseException) -> bool:
    """A subscription worth opening again: it ended with nothing new, or the link failed."""
    return isinstance(exc, _NothingNew) or is_transient(exc)


# A plain publish hashes and sends its tensors in runs of about this many bytes, so hashing one
# run overlaps with sending the one before.
PUBLISH_RUN_BYTES = 64 * 1024 * 1024


def _runs_of(pairs: Sequence[tuple[str, torch.Tensor]], run_bytes: int) -> Iterator[tuple[int, int]]:
    """[start, stop) index ranges of consecutive tensors of about ``run_bytes`` each (at least one tensor)."""
    start, size = 0, 0
    for i, (_, tensor) in enumerate(pairs):
        size += tensor.numel() * tensor.element_size()
        if size >= run_bytes:
            yield start, i + 1
            start, size = i + 1, 0
    if start < len(pairs):
        yield start, len(pairs)


class _StreamedUpload:
    """The trainer's side of one streamed upload across retries: the buckets still to come, and the
    run in hand, kept until the next one is asked for so a retry can resume from its start.

    A bucket's tensors continue the version's bytes in manifest order: whole tensors, or row ranges
    of one larger than a bucket (its first rows in one bucket, the next in the following one), so
    a run may begin or end inside a tensor. The hash of a tensor goes on across runs and its
    checksum travels with the run that holds its last byte.
    """

    def __init__(self, manifest: Manifest, buckets: AsyncIterator[Sequence[torch.Tensor]], share: bool) -> None:
        self.manifest = manifest
        # Whether runs lying in a memory file of this process name it (paramsync may copy them).
        self.share = share
        self._buckets = aiter(buckets)
        self._offsets = [*manifest.offsets(), manifest.total_bytes]
        # Where the bytes taken so far end: inside tensor ``_tensor``, after ``_filled`` of its bytes.
        self._tensor = 0
        self._filled = 0
        self._hasher = new_hasher(manifest.checksum_algorithm)
        self._held: TensorRun | None = None

    @property
    def _taken(self) -> int:
        """The first byte no bucket has given yet."""
        return self._offsets[self._tensor] + self._filled

    def resume_from(self) -> int:
        """Where a new attempt starts: the run in hand, or the first byte not yet taken."""
        return self._held.start if self._held is not None else self._taken

    async def runs(self) -> AsyncIterator[TensorRun]:
        if self._held is not None:
            yield self._held
        while True:
            # The run in hand was sent: free it before its producer may make another.
            self._held = None
            try:
                tensors = await anext(self._buckets)
            except StopAsyncIteration:
                break
            self._held = await threads.to_thread(self._hashed, list(tensors))
            # The run keeps the bucket's bytes; holding its tensors too while the next is awaited
            # would keep a third bucket alive on the trainer.
            del tensors
            yield self._held
        if self._tensor != len(self.manifest.tensors):
            raise ValueError(f"buckets ended after {self._tensor} of {len(self.manifest.tensors)} tensors")

    def _hashed(self, tensors: list[torch.Tensor]) -> TensorRun:
        from services.paramsync.tensors import raw_bytes

        first, start = self._tensor, self._taken
        views, checksums, places = [], [], []
        for tensor in tensors:
            if self._tensor >= len(self.manifest.tensors):
                raise ValueError(f"buckets hold more than the {len(self.manifest.tensors)} tensors of the manifest")
            spec = self.manifest.tensors[self._tensor]
            view = raw_bytes(_checked_part(tensor, spec, self._filled))
            self._hasher.update(view)
            self._filled += view.nbytes
            views.append(view)
            places.append(memory_files.locate(tensor.data_ptr(), view.nbytes) if self.share and view.nbytes else None)
            if self._filled == spec.num_bytes:
                checksums.append(self._hasher.hexdigest())
                self._tensor, self._filled = self._tensor + 1, 0
                self._hasher = new_hasher(self.manifest.checksum_algorithm)
        end = self._taken
        if end == start:
            raise ValueError(f"a bucket of version {self.manifest.version} holds no bytes")
        # A zero-byte tensor at the end of a bucket is not a part of this run (its start is the end).
        parts = len(self.manifest.run_parts(first, start, end))
        return TensorRun(first, checksums, views, start, end, self._shared(views[:parts], places[:parts]))

    @staticmethod
    def _shared(views: list[memoryview], places: list[tuple[int, int] | None]) -> tuple[int, list[int]] | None:
        """The memory file and each part's offset when every part with bytes lies in one file."""
        located = [place for view, place in zip(views, places, strict=True) if view.nbytes]
        if not located or None in located or len({fd for fd, _ in located}) != 1:
            return None
        offsets = iter(offset for _, offset in located)
        return located[0][0], [next(offsets) if view.nbytes else 0 for view in views]


def _checked_part(tensor: torch.Tensor, spec: TensorSpec, filled: int) -> torch.Tensor:
    """``tensor``, which must be the next part of the tensor ``spec`` promised after ``filled`` of its
    bytes: the whole tensor, or rows of it (the same dtype and row shape, within its bytes)."""
    from services.paramsync.tensors import dtype_name

    nbytes = tensor.numel() * tensor.element_size()
    whole = tuple(tensor.shape) == spec.shape
    rows = tensor.dim() > 0 and tuple(tensor.shape[1:]) == spec.shape[1:] and len(spec.shape) == tensor.dim()
    if dtype_name(tensor) != spec.dtype or not (whole or rows) or filled + nbytes > spec.num_bytes:
        raise ValueError(
            f"tensor {spec.name!r}: got {dtype_name(tensor)} {list(tensor.shape)} after {filled} of its bytes, the"
            f" manifest promised {spec.dtype} {list(spec.shape)}"
        )
    return tensor


class ParamSyncClient:
    def __init__(
        self,
        address: str,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        checksum_algorithm: str = DEFAULT_ALGORITHM,
        sync_timeout: float = 300.0,
        max_sync_retries: int = 3,
        sync_retry_delay: float = 1.0,
        data_plane: bool = True,
        reuse_memory: bool = True,
        shared_memory: bool = True,
    ) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        new_hasher(checksum_algorithm)  # fails early on an unknown algorithm
        self.address = address
        self.chunk_bytes = chunk_bytes
        self.checksum_algorithm = checksum_algorithm
        self.sync_timeout = sync_timeout
        self.max_sync_retries = max_sync_retries
        self.sync_retry_delay = sync_retry_delay
        self.data_plane = data_plane
        # Whether fetch_to_file tries mapping paramsync's memory first (off once it cannot).
        self.shared_memory = shared_memory
        # A fetch over the data plane reuses the previous version's memory once the caller has
        # dropped its tensors (fresh memory costs ~0.3 s of page faults per 512 MiB). The price:
        # that memory stays allocated between fetches.
        self._memory = RecycledMemory() if reuse_memory else None
        # None: not asked yet (or to be asked again); False: this paramsync serves none.
        self._data_address: DataPlaneAddress | bool | None = None
        self._channel = grpc_channel(address)
        self._stub = pb_grpc.ParamSyncStub(self._channel)
        self._publish, self._fetch = stream_calls(self._channel)

    async def close(self) -> None:
        if self._memory is not None:
            self._memory.discard()
        await self._channel.close()

    async def __aenter__(self) -> ParamSyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _with_retries(self, call: Any) -> Any:
        """Runs ``call()`` retrying link failures; any gRPC error left becomes a ParamSyncError."""
        policy = sync_retry_policy(self.max_sync_retries, self.sync_retry_delay)
        try:
            return await call_with_retries(f"paramsync call to {self.address}", call, is_transient, policy, log)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from None

    async def _data_plane_address(self) -> DataPlaneAddress | None:
        """Where paramsync's data plane listens (asked once), or None to use gRPC streams."""
        if not self.data_plane or self._data_address is False:
            return None
        if self._data_address is None:
            try:
                info = await self._stub.DataPlane(pb.DataPlaneRequest(), timeout=min(self.sync_timeout, 30.0))
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNIMPLEMENTED:  # an older paramsync has no data plane
                    raise
                info = pb.DataPlaneInfo()
            self._data_address = DataPlaneAddress(_host_of(self.address), info.data_port) if info.data_port else False
        return self._data_address if isinstance(self._data_address, DataPlaneAddress) else None

    def _give_up_data_plane(self, exc: DataPlaneUnreachable) -> None:
        # Asked again next call: a restarted paramsync may listen on another port.
        log.warning("%s; using gRPC streams for this transfer", exc)
        self._data_address = None

    async def _map(self, version: int, replica_id: str) -> shm.MappedVersion | None:
        """The version's memory file when paramsync shares this host; None: fetch its bytes."""
        address = await self._data_plane_address() if self.shared_memory and replica_id else None
        if address is None:
            return None
        try:
            return await shm.map_version(
                address, pb.FetchRequest(replica_id=replica_id, version=version), self.sync_timeout
            )
        except shm.NotMappable as exc:
            if exc.lasting:
                log.warning("fetching weights from paramsync instead of mapping its memory: %s", exc)
                self.shared_memory = False
            return None
        except DataPlaneUnreachable as exc:
            self._give_up_data_plane(exc)
            return None

    def _chunk_streams(self, replica_id: str = "") -> GrpcChunksChannel:
        peer = f"paramsync {self.address}"
        return GrpcChunksChannel(self._publish, self._fetch, peer, self.chunk_bytes, self.sync_timeout, replica_id)

    async def _over_a_channel(
        self,
        transfer: Callable[[ByteChannel], Awaitable[T]],
        replica_id: str = "",
        on_shared_refused: Callable[[str], None] | None = None,
    ) -> T:
        """``transfer`` over the data plane where paramsync serves one, else (or when it does not
        accept a connection) over the gRPC chunk streams."""
        address = await self._data_plane_address()
        if address is not None:
            try:
                return await transfer(TcpChannel(address, self.sync_timeout, replica_id, on_shared_refused))
            except DataPlaneUnreachable as exc:
                self._give_up_data_plane(exc)
        return await transfer(self._chunk_streams(replica_id))

    # --- trainer side -------------------------------------------------------------------------

    async def publish(
        self,
        version: int,
        tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        trainer_step: int = 0,
        handles: WeightHandles | None = None,
    ) -> PublishResult:
        """Uploads ``version`` once; re-publishing the latest version with the same bytes is a no-op.
        ``handles``: see :meth:`publish_streamed`.

        Raises VersionConflict if ``version`` is not newer than the latest and differs from it,
        ChecksumMismatch if paramsync saw different bytes than the manifest promised.
        """
        from services.paramsync.tensors import as_pairs, open_specs

        pairs = as_pairs(tensors)

        async def buckets() -> AsyncIterator[list[torch.Tensor]]:
            for start, stop in _runs_of(pairs, PUBLISH_RUN_BYTES):
                yield [t for _, t in pairs[start:stop]]

        return await self.publish_streamed(version, open_specs(pairs), buckets(), trainer_step, handles)

    async def publish_streamed(
        self,
        version: int,
        specs: Sequence[TensorSpec],
        buckets: AsyncIterator[Sequence[torch.Tensor]],
        trainer_step: int = 0,
        handles: WeightHandles | None = None,
    ) -> PublishResult:
        """Uploads ``version`` while its tensors are still being produced.

        ``specs`` name every tensor (dtype and shape; checksums empty) in upload order, so the
        upload opens at once; ``buckets`` then yields the tensors (contiguous, on the CPU) in that
        order, a few at a time. Each bucket is hashed and sent as it comes, and dropped once the next
        one is asked for; the caller bounds how far ahead it produces. A broken link is retried like
        any call and the upload resumes from the start of the bucket in hand (paramsync keeps the
        bytes it verified). An upload that fails for good is aborted at paramsync, so it never
        becomes visible. Errors as :meth:`publish`.

        With ``handles`` (the same tensors shared by handle on this host, see
        ``services/trainer/weight_handles.py``), paramsync announces the version once its bytes are
        complete, handles included, so a replica on this host can skip the bytes.
        """
        started = time.perf_counter()
        manifest = Manifest(version, tuple(specs), self.checksum_algorithm, trainer_step, handles=handles)
        manifest.validate()
        if not manifest.is_open:
            raise ValueError("publish_streamed takes specs without checksums; they are computed from the buckets")
        upload = _StreamedUpload(manifest, buckets, self.shared_memory)

        def refused(reason: str) -> None:
            log.warning("sending weight bytes to paramsync instead of naming this process's memory: %s", reason)
            self.shared_memory = upload.share = False

        async def call() -> int:
            resume_from = upload.resume_from()
            return await self._over_a_channel(
                lambda channel: channel.send(manifest, upload.runs(), resume_from), on_shared_refused=refused
            )

        try:
            received = await self._with_retries(call)
        except BaseException as exc:
            await self._abort_upload(version, f"{type(exc).__name__}: {exc}")
            raise
        return PublishResult(version, received, manifest.total_bytes, time.perf_counter() - started)

    async def _abort_upload(self, version: int, reason: str) -> None:
        """Tells paramsync to drop the open upload of ``version`` now rather than after its resume window."""
        try:
            # Bounded like any exchange: a paramsync that stopped answering must not delay the error.
            request = pb.AbortUploadRequest(version=version, reason=reason[:500])
            await self._stub.AbortUpload(request, timeout=min(5.0, self.sync_timeout))
        except grpc.aio.AioRpcError as err:
            log.warning("could not abort the upload of version %d at %s: %s", version, self.address, err.code().name)

    # --- replica side -------------------------------------------------------------------------

    async def subscribe(
        self, replica_id: str, held_version: int = 0, engine_url: str = ""
    ) -> AsyncIterator[Announcement]:
        """Yields each version newer than ``held_version``, the latest one at once.

        Runs until cancelled. If the link drops it reconnects with backoff (``sync_retry_delay``
        doubling, at most 30 s; a subscription that delivered a version starts the backoff over)
        and resumes after the last version it yielded, so a paramsync restart is invisible to the
        caller apart from the pause.
        """
        if not replica_id:
            raise ValueError("replica_id must be non-empty")
        policy = RetryPolicy(attempts=None, first_wait_s=self.sync_retry_delay, max_wait_s=30.0)
        last = held_version
        while True:
            async for attempt in retrying(f"subscription to {self.address}", _dropped, policy, log):
                with attempt:
                    before = last
                    request = pb.SubscribeRequest(replica_id=replica_id, held_version=last, engine_url=engine_url)
                    try:
                        async for msg in self._stub.Subscribe(request):
                            if msg.version > last:
                                last = msg.version
                                yield Announcement.from_proto(msg)
                    except grpc.aio.AioRpcError as err:
                        if err.code() not in TRANSIENT_CODES:
                            raise from_rpc_error(err) from None
                        if last == before:
                            raise
                        log.warning("subscription to %s dropped (%s); reconnecting", self.address, err.code().name)
                    if last == before:
                        raise _NothingNew(f"{self.address} ended the subscription without a new version")

    async def fetch(self, version: int = 0, replica_id: str = "") -> dict[str, torch.Tensor]:
        """The tensors of ``version`` (0: the latest), each verified against the manifest's checksum."""
        return (await self.fetch_version(version, replica_id)).tensors

    async def fetch_version(self, version: int = 0, replica_id: str = "") -> FetchedVersion:
        """Like :meth:`fetch`, with the manifest (so a caller asking for 0 learns which version came)."""
        request = pb.FetchRequest(replica_id=replica_id, version=version)

        async def call() -> FetchedVersion:
            address = await self._data_plane_address()
            if address is not None:
                try:
                    got = await tcp.fetch(address, request, self.sync_timeout, self._memory)
                except DataPlaneUnreachable as exc:
                    self._give_up_data_plane(exc)
                else:
                    return FetchedVersion(got.manifest, got.tensors)
            return await _receive_tensors(self._chunk_streams(replica_id), request.version)

        return await self._with_retries(call)

    async def fetch_to_file(
        self, version: int, files: VersionFiles, replica_id: str = "", reusable_below: int = 0
    ) -> Path:
        """Receives ``version`` (0: the latest) straight into a safetensors file of ``files`` and
        returns its directory, which an engine loads with ``/update_weights_from_disk``.

        Each tensor is verified against the manifest's checksum as it lands; on any mismatch
        (ChecksumMismatch) or other failure no file of the version is left. ``reusable_below``:
        files of versions older than this are no longer read and their memory may be reused.
        On paramsync's host the directory links to paramsync's memory file instead, and nothing
        is received.
        """

        async def call() -> Path:
            mapped = await self._map(version, replica_id)
            if mapped is not None:
                return files.add_mapped(mapped)
            with files.receiving(reusable_below) as landing:
                await self._over_a_channel(lambda channel: channel.receive(version, landing.place), replica_id)
                return landing.commit()

        return await self._with_retries(call)

    async def report_version(
        self, replica_id: str, version: int, ok: bool = True, error: str = "", sync_s: float = 0.0
    ) -> int:
        """Records what the replica now holds (or failed to load); returns the latest version."""
        request = pb.ReportVersionRequest(replica_id=replica_id, version=version, ok=ok, error=error, sync_s=sync_s)

        async def call() -> pb.ReportVersionResponse:
            return await self._stub.ReportVersion(request, timeout=min(self.sync_timeout, 30.0))

        return (await self._with_retries(call)).latest_version

    async def list_replicas(self) -> VersionTable:
        async def call() -> pb.ListReplicasResponse:
            return await self._stub.ListReplicas(pb.ListReplicasRequest(), timeout=min(self.sync_timeout, 30.0))

        reply = await self._with_retries(call)
        return VersionTable(reply.latest_version, [ReplicaVersion.from_proto(r) for r in reply.replicas])


async def _receive_tensors(channel: ByteChannel, version: int) -> FetchedVersion:
    """``version`` received over ``channel`` into fresh tensors, every checksum checked."""
    from services.paramsync.tensors import empty_like_spec, typed_view

    buffers: list[torch.Tensor] = []

    def place(manifest: Manifest) -> list[memoryview]:
        buffers.extend(empty_like_spec(spec) for spec in manifest.tensors)
        return [memoryview(buf.numpy()) for buf in buffers]

    manifest = await channel.receive(version, place)
    tensors = {spec.name: typed_view(buf, spec) for spec, buf in zip(manifest.tensors, buffers, strict=True)}
    return FetchedVersion(manifest, tensors)
