"""Writing a stored version as a safetensors file, and reading it back, straight from raw bytes.

A version's buffer already is the tensors back to back in manifest order, which is exactly
the data section of a safetensors file; so the file is an 8-byte header length, the JSON
header and the buffer, written without torch and without another copy. The manifest (with its
checksums) travels in the header's ``__metadata__`` so a version read back is verifiable.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from services.paramsync.digest import new_hasher
from services.paramsync.manifest import Manifest, TensorSpec
from services.paramsync.store import StoredVersion

if TYPE_CHECKING:
    from services.paramsync.channels.base import Place

FILE_NAME = "model.safetensors"
_DIR_PREFIX = "v"


def version_dir(root: Path, version: int) -> Path:
    return root / f"{_DIR_PREFIX}{version:012d}"


def safetensors_header(manifest: Manifest) -> bytes:
    """The JSON header of the file holding ``manifest``'s tensors back to back, padded to 8 bytes."""
    header = manifest.safetensors_entries()
    header["__metadata__"] = {
        "format": "pt",
        "relayrl_version": str(manifest.version),
        "relayrl_manifest": json.dumps(
            {
                "version": manifest.version,
                "checksum_algorithm": manifest.checksum_algorithm,
                "trainer_step": manifest.trainer_step,
                "created_at_unix_s": manifest.created_at_unix_s,
                "tensors": [[t.name, t.dtype, list(t.shape), t.num_bytes, t.checksum] for t in manifest.tensors],
            }
        ),
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    # safetensors pads the header with spaces so the data starts 8-byte aligned.
    return raw + b" " * (-len(raw) % 8)


def write_version(stored: StoredVersion, root: Path) -> Path:
    """Writes ``root/v<version>/model.safetensors`` atomically (temp dir, then rename); returns the dir."""
    target = version_dir(root, stored.version)
    if (target / FILE_NAME).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".{target.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    header = safetensors_header(stored.manifest)
    with open(staging / FILE_NAME, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        f.write(memoryview(stored.data))
        f.flush()
        os.fsync(f.fileno())
    os.replace(staging, target)
    return target


def read_into(directory: Path, place: Place) -> Manifest:
    """Reads a directory written by :func:`write_version` into the views ``place`` gives once the
    manifest in its metadata is known, every tensor checked against its checksum; returns that
    manifest. ValueError if it is not such a directory, is truncated, or a tensor differs."""
    path = directory / FILE_NAME
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        meta = json.loads(header.get("__metadata__", {}).get("relayrl_manifest", "null") or "null")
        if not isinstance(meta, dict):
            raise ValueError(f"{path} has no relayrl manifest in its metadata")
        manifest = Manifest(
            version=meta["version"],
            tensors=tuple(TensorSpec(n, d, tuple(s), b, c) for n, d, s, b, c in meta["tensors"]),
            checksum_algorithm=meta["checksum_algorithm"],
            trainer_step=meta["trainer_step"],
            created_at_unix_s=meta["created_at_unix_s"],
        )
        manifest.validate()
        for spec, view in zip(manifest.tensors, place(manifest), strict=True):
            if f.readinto(view) != spec.num_bytes:
                raise ValueError(f"{path} is truncated")
            hasher = new_hasher(manifest.checksum_algorithm)
            hasher.update(view)
            if hasher.hexdigest() != spec.checksum:
                raise ValueError(f"{path}: tensor {spec.name!r} does not match its checksum")
    return manifest


def read_version(directory: Path) -> StoredVersion:
    """Reads a directory written by :func:`write_version` as a stored version; ValueError as :func:`read_into`."""
    placed: list[StoredVersion] = []

    def place(manifest: Manifest) -> list[memoryview]:
        placed.append(StoredVersion.empty(manifest))
        data, starts = placed[0].data, manifest.offsets()
        return [data[start : start + spec.num_bytes] for spec, start in zip(manifest.tensors, starts, strict=True)]

    read_into(directory, place)
    return placed[0]


def list_versions(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        if child.name.startswith(_DIR_PREFIX) and child.name[1:].isdigit() and (child / FILE_NAME).is_file():
            found.append(int(child.name[1:]))
    return sorted(found)


def prune(root: Path, keep: int) -> None:
    """Deletes all but the newest ``keep`` version directories."""
    for version in list_versions(root)[:-keep]:
        shutil.rmtree(version_dir(root, version), ignore_errors=True)
