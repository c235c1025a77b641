"""``shared_memory``: a version handed over on paramsync's own host without moving its bytes.

Paramsync keeps each version in a memory file laid out as a safetensors file
(``services/paramsync/memory.py``). A replica on the same host asks for that file over the data
plane (``BulkRequest.map``), opens it through ``/proc/<pid>/fd/<fd>`` and gives its engine a
path to it: the engine maps the very memory the trainer's upload landed in. No byte crosses a
socket after the upload, and the replica holds no copy of the weights.

- **Same host, proved.** The reply names paramsync's host; a client on another host does not try
  the path. The file a client opens must carry the reply's token and version in its header, so
  a recycled pid or descriptor number (another container, a restarted paramsync, a version
  dropped meanwhile) is never taken for the version.
- **The memory stays as it is.** Paramsync records the replica as a user of the version and
  writes no other version into that memory until the replica reports holding a newer one
  (:meth:`~services.paramsync.store.VersionStore.release_mappings`): its engine may serve the
  file in place. The client keeps its own descriptor, so the memory outlives paramsync dropping
  the version, or paramsync itself.
- **Checksums.** Every tensor was verified as it landed in paramsync; nothing moved since.
- A replica that cannot map a version (another host, no access to paramsync's ``/proc``, a
  paramsync keeping versions in private memory) gets :class:`NotMappable` and fetches the bytes
  over ``tcp`` instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import grpc

from relayrl.v1 import paramsync_pb2 as pb
from services.paramsync.channels.dataplane import (
    DataPlaneAddress,
    FrameError,
    check_reply,
    connect,
    exchange,
    in_thread,
    link_error,
    status_reply,
)
from services.paramsync.errors import status_of
from services.paramsync.manifest import Manifest
from services.paramsync.memory import TOKEN_KEY, SharedVersionMemory
from services.paramsync.store import StoreError

if TYPE_CHECKING:
    from services.paramsync.core import ParamSyncCore


class Replier(Protocol):
    """The data plane's server, as the map handler uses it (``tcp.DataPlaneServer``)."""

    core: ParamSyncCore

    async def send_reply(self, conn: socket.socket, reply: pb.BulkReply) -> None: ...


# A header is at most a few MB even for 100k tensors; anything larger is not our file.
MAX_HEADER_BYTES = 64 * 1024 * 1024


class NotMappable(Exception):
    """This replica cannot map the version's memory; fetch its bytes instead. ``lasting``: nor
    any other version from this paramsync (another host, no access to its files)."""

    def __init__(self, message: str, lasting: bool = True) -> None:
        super().__init__(message)
        self.lasting = lasting


@dataclass
class MappedVersion:
    """A version's memory file, open in this process (``fd``) until :meth:`close`."""

    manifest: Manifest
    fd: int
    _closed: bool = field(default=False, repr=False)

    @property
    def path(self) -> Path:
        """A path another process of this host opens the file by, while this one keeps it open."""
        return Path(f"/proc/{os.getpid()}/fd/{self.fd}")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self.fd)


# --- the replica's end -----------------------------------------------------------------------


async def map_version(address: DataPlaneAddress, request: pb.FetchRequest, timeout_s: float) -> MappedVersion:
    """Opens the memory file of a complete version (``request.version``, 0: the latest); NotMappable
    when this process cannot, other failures as a fetch's."""
    sock = await connect(address, timeout_s)
    with sock:
        try:
            async with asyncio.timeout(timeout_s):
                reply = await in_thread(sock, exchange, sock, pb.BulkRequest(map=request))
        except (OSError, TimeoutError, FrameError) as exc:
            raise link_error(exc, f"mapping version {request.version}") from exc
    if reply.code == grpc.StatusCode.UNIMPLEMENTED.value[0]:
        raise NotMappable(reply.message)
    check_reply(reply)
    if not reply.HasField("shared"):
        raise NotMappable("paramsync answered without a memory file (an older paramsync)")
    return _open(Manifest.from_proto(reply.manifest), reply.shared)


def _open(manifest: Manifest, shared: pb.SharedVersion) -> MappedVersion:
    if shared.host != socket.gethostname():
        raise NotMappable(f"paramsync runs on host {shared.host!r}, this replica on {socket.gethostname()!r}")
    try:
        fd = os.open(f"/proc/{shared.pid}/fd/{shared.fd}", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:  # paramsync dropped the version since it answered
        raise NotMappable(f"paramsync's memory file of version {manifest.version} is gone", lasting=False) from exc
    except OSError as exc:
        raise NotMappable(f"cannot open paramsync's memory file of version {manifest.version}: {exc}") from exc
    try:
        _check_file(fd, manifest.version, shared)
    except BaseException:
        os.close(fd)
        raise
    return MappedVersion(manifest, fd)


def _check_file(fd: int, version: int, shared: pb.SharedVersion) -> None:
    """NotMappable unless the file at ``fd`` is the one the reply describes."""
    # paramsync dropped the version since it answered, and the descriptor number was reused.
    mismatch = NotMappable(f"the file paramsync named for version {version} is not that version's memory", False)
    if os.fstat(fd).st_size != shared.file_bytes:
        raise mismatch
    (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    if not 0 < length <= min(MAX_HEADER_BYTES, shared.file_bytes - 8):
        raise mismatch
    try:
        metadata = json.loads(os.pread(fd, length, 8)).get("__metadata__", {})
    except (ValueError, AttributeError):
        raise mismatch from None
    if metadata.get(TOKEN_KEY) != shared.token or metadata.get("relayrl_version") != str(version):
        raise mismatch


# --- paramsync's end -------------------------------------------------------------------------


async def serve_map(server: Replier, conn: socket.socket, request: pb.FetchRequest) -> None:
    """Answers a map request: the complete version's memory file, once its upload has ended."""
    if not request.replica_id or request.version < 0:
        message = "a map request names its replica and a version >= 0"
        await server.send_reply(conn, status_reply(grpc.StatusCode.INVALID_ARGUMENT, message))
        return
    try:
        stored = server.core.store.get(request.version)
    except StoreError as err:
        await server.send_reply(conn, status_reply(status_of(err), str(err)))
        return
    try:
        committed = await stored.wait_ended(server.core.upload_idle_timeout_s)
    except TimeoutError:
        message = f"version {stored.version}: its upload stalled while a map request waited"
        await server.send_reply(conn, status_reply(grpc.StatusCode.DEADLINE_EXCEEDED, message))
        return
    if not committed:
        message = f"version {stored.version} was not published: {stored.error}"
        await server.send_reply(conn, status_reply(grpc.StatusCode.NOT_FOUND, message))
        return
    memory = stored.memory
    if not isinstance(memory, SharedVersionMemory):
        message = f"paramsync keeps version {stored.version} in private memory"
        await server.send_reply(conn, status_reply(grpc.StatusCode.UNIMPLEMENTED, message))
        return
    # Before the answer: from here on the memory is never recycled under the replica's engine.
    stored.mapped_by.add(request.replica_id)
    shared = pb.SharedVersion(
        pid=os.getpid(), fd=memory.fd, host=socket.gethostname(), token=memory.token, file_bytes=memory.file_bytes
    )
    await server.send_reply(conn, pb.BulkReply(manifest=stored.manifest.to_proto(), shared=shared))
