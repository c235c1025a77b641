"""Versions written as safetensors load with the safetensors library and read back verified."""

import pytest
import torch
from safetensors.torch import load_file

from services.paramsync import safetensors_io
from services.paramsync.store import StoredVersion
from services.paramsync.tensors import as_pairs, build_manifest, raw_bytes


def stored_version(version: int, state: dict[str, torch.Tensor]) -> StoredVersion:
    pairs = as_pairs(state)
    stored = StoredVersion.empty(build_manifest(version, pairs, 0, "sha256"))
    stored.data[:] = b"".join(bytes(raw_bytes(t)) for _, t in pairs)
    return stored


def test_written_version_loads_with_safetensors_and_reads_back(tmp_path):
    state = {"w": torch.randn(4, 3), "h": torch.randn(5).to(torch.bfloat16), "n": torch.arange(3)}
    directory = safetensors_io.write_version(stored_version(7, state), tmp_path)
    loaded = load_file(str(directory / safetensors_io.FILE_NAME))
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    again = safetensors_io.read_version(directory)
    assert again.version == 7 and again.manifest.tensors[0].name == "w"


def test_a_corrupted_file_is_refused_and_pruning_keeps_the_newest(tmp_path):
    for v in (1, 2, 3):
        safetensors_io.write_version(stored_version(v, {"w": torch.full((64,), float(v))}), tmp_path)
    path = safetensors_io.version_dir(tmp_path, 3) / safetensors_io.FILE_NAME
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(raw)
    with pytest.raises(ValueError, match="checksum"):
        safetensors_io.read_version(path.parent)
    safetensors_io.prune(tmp_path, keep=2)
    assert safetensors_io.list_versions(tmp_path) == [2, 3]
