"""The trajectory log: every group the trainer consumed, in consumption order, with its versions.

``<run_dir>/trajectories/`` holds ``config.json`` (the trainer's settings and what replaying them
exactly needs: torch threads, world size) and segments ``segment_<first step>.log``. A segment is
a run of records, one per training step, each framed as ``RTL1 | body length | CRC-32 | body``;
the body is a JSON header (step, version, group ids) then each group's serialized
``TrajectoryGroup``, every part length-prefixed. ``relayrl replay`` re-runs the training from it
with no engine and no queue (:mod:`services.trainer.replay`).

Durability. A step's record is written (to the OS) when its batch is taken, before the step
trains, so a trainer killed by SIGKILL has logged every batch it consumed; a record cut short by
the kill fails its length or CRC and ends the log there. Before a checkpoint becomes durable the
segment is fsynced (``trajectory_log_fsync = step``: every record), so no checkpoint outlives the
log that leads to it, even across a power loss. The checkpoint then starts a new segment.

Bounded like the checkpoints: with ``trajectory_log_keep = checkpoints``, segments holding only
steps at or before the oldest checkpoint kept are deleted, so the log replays from that
checkpoint on; ``all`` keeps every step from the first.

A resumed trainer trains again from its checkpoint K: :meth:`TrajectoryLog.resume_at` first cuts
the log after step K (the old tail trained weights that the crash lost), so the log always names
the lineage of the weights that live on.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayrl.schema import Group
from relayrl.v1 import trajectory_pb2 as pb

LOG_DIR = "trajectories"
CONFIG_FILE = "config.json"
MAGIC = b"RTL1"
_FRAME = struct.Struct("<4sII")  # magic, body length, CRC-32 of the body
_LEN = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class StepRecord:
    """The batch that trained ``step`` (1-based) at policy ``version``."""

    step: int
    version: int
    group_ids: list[str]
    payloads: list[bytes]  # each a serialized TrajectoryGroup, in batch order

    def groups(self) -> list[Group]:
        return [Group.from_proto(pb.TrajectoryGroup.FromString(p)) for p in self.payloads]


def encode(record: StepRecord) -> bytes:
    header = json.dumps({"step": record.step, "version": record.version, "group_ids": record.group_ids}).encode()
    parts = [_LEN.pack(len(header)), header]
    for payload in record.payloads:
        parts += [_LEN.pack(len(payload)), payload]
    body = b"".join(parts)
    return _FRAME.pack(MAGIC, len(body), zlib.crc32(body)) + body


def _decode(body: bytes) -> StepRecord:
    (size,) = _LEN.unpack_from(body, 0)
    at = _LEN.size + size
    header = json.loads(body[_LEN.size : at])
    payloads = []
    while at < len(body):
        (size,) = _LEN.unpack_from(body, at)
        payloads.append(body[at + _LEN.size : at + _LEN.size + size])
        at += _LEN.size + size
    return StepRecord(int(header["step"]), int(header["version"]), list(header["group_ids"]), payloads)


def _scan(path: Path) -> Iterator[tuple[int, StepRecord]]:
    """(end offset, record) of each whole record of a segment; stops at the first torn or corrupt one."""
    data = path.read_bytes()
    at = 0
    while at + _FRAME.size <= len(data):
        magic, size, crc = _FRAME.unpack_from(data, at)
        body = data[at + _FRAME.size : at + _FRAME.size + size]
        if magic != MAGIC or len(body) != size or zlib.crc32(body) != crc:
            return
        at += _FRAME.size + size
        yield at, _decode(body)


def segments(root: Path) -> list[Path]:
    return sorted(root.glob("segment_*.log"))


def read_records(root: Path) -> list[StepRecord]:
    """Every whole record of the log, oldest first (a torn tail, as a kill leaves it, is left out)."""
    return [record for path in segments(root) for _, record in _scan(path)]


def read_config(root: Path) -> dict[str, Any]:
    return json.loads((root / CONFIG_FILE).read_text())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TrajectoryLog:
    """Rank 0's writer of the log (see the module docstring)."""

    def __init__(self, root: Path, fsync_every_step: bool, keep_all: bool) -> None:
        self.root = root
        self.fsync_every_step = fsync_every_step
        self.keep_all = keep_all
        self._file: Any = None
        root.mkdir(parents=True, exist_ok=True)

    def write_config(self, config: dict[str, Any]) -> None:
        tmp = self.root / f"{CONFIG_FILE}.tmp"
        tmp.write_text(json.dumps(config, indent=1, sort_keys=True))
        os.replace(tmp, self.root / CONFIG_FILE)

    def resume_at(self, step: int) -> None:
        """Cuts every record after ``step`` (and a torn tail) before the trainer goes on from ``step``."""
        self.close()
        cut = False
        for path in segments(self.root):
            if cut:
                path.unlink()
                continue
            end = 0
            for record_end, record in _scan(path):
                if record.step > step:
                    cut = True
                    break
                end = record_end
            if end < path.stat().st_size:
                with path.open("r+b") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
            if end == 0:
                path.unlink()
        _fsync_dir(self.root)

    def append(self, step: int, version: int, groups: list[Group]) -> None:
        """Logs the batch that trains ``step``; it reaches the OS before this returns."""
        if self._file is None:
            self._file = (self.root / f"segment_{step:08d}.log").open("ab")
            _fsync_dir(self.root)
        payloads = [g.to_proto().SerializeToString() for g in groups]
        self._file.write(encode(StepRecord(step, version, [g.group_id for g in groups], payloads)))
        self._file.flush()
        if self.fsync_every_step:
            os.fsync(self._file.fileno())

    def sync(self) -> None:
        """fsyncs what was logged: called before a checkpoint becomes durable."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def checkpointed(self, oldest_kept_step: int | None) -> None:
        """After a durable checkpoint: the next record opens a new segment, and segments no kept
        checkpoint needs go (unless the whole log is kept)."""
        self.close()
        if self.keep_all or oldest_kept_step is None:
            return
        paths = segments(self.root)
        firsts = [int(p.stem.removeprefix("segment_")) for p in paths]
        for path, next_first in zip(paths, firsts[1:], strict=False):
            if next_first <= oldest_kept_step + 1:
                path.unlink()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
