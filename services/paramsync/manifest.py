"""The typed manifest of one policy version, and its validation.

A version is a list of tensors uploaded back to back in manifest order; tensor ``i`` occupies
bytes ``[offset_i, offset_i + num_bytes_i)`` of the version's concatenated raw bytes. This module
imports no torch: the store works on raw bytes and only the client turns them into tensors.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from relayrl.v1 import paramsync_pb2 as pb
from services.paramsync.digest import ALGORITHMS, DEFAULT_ALGORITHM

# Element sizes by torch dtype name (without "torch."), and the safetensors code of each.
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
SAFETENSORS_DTYPES: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}


def _numel_up_to(shape: tuple[int, ...], limit: int) -> int:
    """The element count, or any number above ``limit`` once it is passed: a shape of millions of
    dimensions would otherwise cost minutes of big-integer arithmetic (found by ``relayrl fuzz``)."""
    numel = 1
    for d in shape:
        numel *= d
        if numel > limit:
            return limit + 1
    return numel


def _shape_text(shape: tuple[int, ...]) -> str:
    # The reason travels in the gRPC status, whose trailer has a size limit.
    return str(list(shape)) if len(shape) <= 8 else f"[{', '.join(map(str, shape[:8]))}, ...] ({len(shape)} dims)"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    num_bytes: int
    checksum: str

    def to_proto(self) -> pb.TensorSpec:
        return pb.TensorSpec(
            name=self.name, dtype=self.dtype, shape=self.shape, num_bytes=self.num_bytes, checksum=self.checksum
        )


@dataclass(frozen=True, slots=True)
class WeightHandles:
    """A version's tensors shared by handle on the trainer's host (the proto WeightHandles): one
    SGLang ``/update_weights_from_tensor`` payload per bucket."""

    host: str
    load_format: str
    buckets: tuple[str, ...]

    def to_proto(self) -> pb.WeightHandles:
        return pb.WeightHandles(host=self.host, load_format=self.load_format, buckets=self.buckets)

    @classmethod
    def from_proto(cls, msg: pb.WeightHandles) -> WeightHandles | None:
        """None for an absent (empty) message; ValueError for one without a host or buckets."""
        if not (msg.host or msg.load_format or msg.buckets):
            return None
        if not msg.host or not msg.buckets:
            raise ValueError("weight handles must name the trainer's host and at least one bucket")
        return cls(msg.host, msg.load_format, tuple(msg.buckets))


@dataclass(frozen=True, slots=True)
class Manifest:
    version: int
    tensors: tuple[TensorSpec, ...]
    checksum_algorithm: str = DEFAULT_ALGORITHM
    trainer_step: int = 0
    created_at_unix_s: float = field(default_factory=time.time)
    # Publish only: the trainer's handles to the same tensors (paramsync keeps them beside the
    # stored version, not in the manifest it serves).
    handles: WeightHandles | None = None

    @property
    def total_bytes(self) -> int:
        return sum(t.num_bytes for t in self.tensors)

    def offsets(self) -> list[int]:
        """Start of each tensor inside the version's concatenated bytes."""
        starts, position = [], 0
        for spec in self.tensors:
            starts.append(position)
            position += spec.num_bytes
        return starts

    def run_parts(self, first: int, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of a streamed upload's run of bytes [``start``, ``end``) that begins inside
        tensor ``first``: one per tensor it touches, from ``first`` on, as (position in the version,
        bytes). ValueError unless ``start`` lies in tensor ``first`` and ``start < end <= total``."""
        offsets = self.offsets()
        if not 0 <= first < len(self.tensors):
            raise ValueError(f"the run begins in tensor {first} of {len(self.tensors)}")
        size = self.tensors[first].num_bytes
        if not offsets[first] <= start < offsets[first] + size and start != offsets[first]:
            raise ValueError(f"byte {start} does not lie in tensor {first} ({self.tensors[first].name!r})")
        if not start < end <= self.total_bytes:
            raise ValueError(f"the run's bytes [{start}, {end}) do not lie in the version's {self.total_bytes}")
        parts, k = [], first
        while k < len(self.tensors) and offsets[k] < end:
            begin = max(start, offsets[k])
            parts.append((begin, min(end, offsets[k] + self.tensors[k].num_bytes) - begin))
            k += 1
        return parts

    def safetensors_entries(self) -> dict[str, object]:
        """Each tensor's entry in the header of a safetensors file holding them back to back."""
        return {
            spec.name: {
                "dtype": SAFETENSORS_DTYPES[spec.dtype],
                "shape": list(spec.shape),
                "data_offsets": [start, start + spec.num_bytes],
            }
            for spec, start in zip(self.tensors, self.offsets(), strict=True)
        }

    @property
    def is_open(self) -> bool:
        """A streamed upload's manifest: checksums arrive after it, with the bytes."""
        return not self.tensors[0].checksum if self.tensors else False

    def layout(self) -> tuple[tuple[str, str, tuple[int, ...], int], ...]:
        """Names, dtypes, shapes and sizes: what an open manifest promises."""
        return tuple((t.name, t.dtype, t.shape, t.num_bytes) for t in self.tensors)

    def same_content(self, other: Manifest) -> bool:
        """True when both describe byte-identical weights (re-publishing after a trainer restart)."""
        return self.checksum_algorithm == other.checksum_algorithm and self.tensors == other.tensors

    def with_checksums(self, checksums: Sequence[str]) -> Manifest:
        """This manifest closed: every tensor with its checksum."""
        tensors = tuple(dataclasses.replace(t, checksum=c) for t, c in zip(self.tensors, checksums, strict=True))
        return dataclasses.replace(self, tensors=tensors)

    def validate(self) -> None:
        """Raises ValueError naming the first problem; the manifest comes from another process."""
        if self.version <= 0:
            raise ValueError(f"version must be a positive integer, got {self.version}")
        if self.checksum_algorithm not in ALGORITHMS:
            raise ValueError(f"checksum_algorithm {self.checksum_algorithm!r} is not one of {', '.join(ALGORITHMS)}")
        if not self.tensors:
            raise ValueError("manifest lists no tensors")
        seen: set[str] = set()
        is_open = self.is_open
        for spec in self.tensors:
            if not spec.name or spec.name in seen:
                raise ValueError(f"tensor names must be unique and non-empty, got {spec.name!r} twice or empty")
            seen.add(spec.name)
            if spec.dtype not in DTYPE_BYTES:
                raise ValueError(f"tensor {spec.name!r}: unsupported dtype {spec.dtype!r}")
            if any(d < 0 for d in spec.shape):
                raise ValueError(f"tensor {spec.name!r}: negative dimension in shape {_shape_text(spec.shape)}")
            numel = _numel_up_to(spec.shape, max(spec.num_bytes, 0))
            if spec.num_bytes != numel * DTYPE_BYTES[spec.dtype]:
                expected = "more" if numel > spec.num_bytes else numel * DTYPE_BYTES[spec.dtype]
                raise ValueError(
                    f"tensor {spec.name!r}: num_bytes {spec.num_bytes} != {expected} for shape"
                    f" {_shape_text(spec.shape)} of {spec.dtype}"
                )
            if bool(spec.checksum) == is_open:
                raise ValueError(f"tensor {spec.name!r}: checksums must be given for every tensor or for none")

    def to_proto(self) -> pb.WeightManifest:
        return pb.WeightManifest(
            version=self.version,
            tensors=[t.to_proto() for t in self.tensors],
            total_bytes=self.total_bytes,
            checksum_algorithm=self.checksum_algorithm,
            created_at_unix_s=self.created_at_unix_s,
            trainer_step=self.trainer_step,
            handles=self.handles.to_proto() if self.handles is not None else None,
        )

    @classmethod
    def from_proto(cls, msg: pb.WeightManifest) -> Manifest:
        """Converts and validates; raises ValueError on a malformed manifest."""
        manifest = cls(
            version=msg.version,
            tensors=tuple(TensorSpec(t.name, t.dtype, tuple(t.shape), t.num_bytes, t.checksum) for t in msg.tensors),
            checksum_algorithm=msg.checksum_algorithm,
            trainer_step=msg.trainer_step,
            created_at_unix_s=msg.created_at_unix_s,
            handles=WeightHandles.from_proto(msg.handles),
        )
        manifest.validate()
        if msg.total_bytes != manifest.total_bytes:
            raise ValueError(f"total_bytes {msg.total_bytes} != sum of tensor sizes {manifest.total_bytes}")
        return manifest


@dataclass(frozen=True, slots=True)
class Announcement:
    """A new version a replica should hold (the proto VersionAnnouncement)."""

    version: int
    total_bytes: int
    published_at_unix_s: float
    transport: str
    disk_path: str = ""
    handles: WeightHandles | None = None

    def to_proto(self) -> pb.VersionAnnouncement:
        return pb.VersionAnnouncement(
            version=self.version,
            total_bytes=self.total_bytes,
            published_at_unix_s=self.published_at_unix_s,
            transport=self.transport,
            disk_path=self.disk_path,
            handles=self.handles.to_proto() if self.handles is not None else None,
        )

    @classmethod
    def from_proto(cls, msg: pb.VersionAnnouncement) -> Announcement:
        return cls(
            msg.version,
            msg.total_bytes,
            msg.published_at_unix_s,
            msg.transport,
            msg.disk_path,
            WeightHandles.from_proto(msg.handles),
        )


@dataclass(frozen=True, slots=True)
class ReplicaVersion:
    """One row of the version table: a replica and the version it holds (the proto ReplicaVersion)."""

    replica_id: str
    version: int
    updated_at_unix_s: float
    lag_versions: int
    state: str
    consecutive_failures: int = 0
    last_error: str = ""
    engine_url: str = ""

    def to_proto(self) -> pb.ReplicaVersion:
        return pb.ReplicaVersion(
            replica_id=self.replica_id,
            version=self.version,
            updated_at_unix_s=self.updated_at_unix_s,
            lag_versions=self.lag_versions,
            state=self.state,
            consecutive_failures=self.consecutive_failures,
            last_error=self.last_error,
            engine_url=self.engine_url,
        )

    @classmethod
    def from_proto(cls, msg: pb.ReplicaVersion) -> ReplicaVersion:
        return cls(
            msg.replica_id,
            msg.version,
            msg.updated_at_unix_s,
            msg.lag_versions,
            msg.state,
            msg.consecutive_failures,
            msg.last_error,
            msg.engine_url,
        )
