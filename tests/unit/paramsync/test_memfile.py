"""Versions received in place into safetensors files: loadable only once complete, pruned, and
received into the memory of an older version the engine no longer reads."""

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from services.paramsync import safetensors_io
from services.paramsync.memfile import VersionFiles
from services.paramsync.tensors import as_pairs, build_manifest, raw_bytes

# An odd number of bf16 values ahead of fp32 ones: the fp32 tensor starts off its 4-byte alignment.
STATE = {
    "h": torch.randn(5).to(torch.bfloat16),
    "w": torch.randn(4, 3),
    "n": torch.arange(3),
    "empty": torch.zeros(0, 2),
}


def receive(files: VersionFiles, version: int, state: dict[str, torch.Tensor], reusable_below: int = 0) -> Path:
    """What a fetch does: place the version, write every tensor's bytes into its view, commit."""
    pairs = as_pairs(state)
    with files.receiving(reusable_below) as landing:
        for view, (_, tensor) in zip(landing.place(build_manifest(version, pairs, 0, "xxh3_128")), pairs, strict=True):
            view[:] = raw_bytes(tensor)
        return landing.commit()


def loadable(root: Path) -> list[Path]:
    return sorted(root.rglob("*.safetensors"))


def test_a_received_version_is_a_safetensors_file_with_the_exact_tensors_and_manifest(tmp_path):
    files = VersionFiles(tmp_path / "r0")
    directory = receive(files, 7, STATE)
    assert directory == safetensors_io.version_dir(tmp_path / "r0", 7)
    loaded = load_file(str(directory / safetensors_io.FILE_NAME))
    assert loaded.keys() == STATE.keys() and all(torch.equal(loaded[k], STATE[k]) for k in STATE)
    # The manifest rides in the header: the file verifies against its own checksums.
    assert safetensors_io.read_version(directory).version == 7


def test_an_abandoned_version_leaves_no_file(tmp_path):
    files = VersionFiles(tmp_path / "r0")
    receive(files, 1, STATE)
    pairs = as_pairs(STATE)
    with pytest.raises(RuntimeError, match="checksum"), files.receiving() as landing:
        landing.place(build_manifest(2, pairs, 0, "xxh3_128"))
        raise RuntimeError("checksum differs")
    assert loadable(tmp_path / "r0") == [safetensors_io.version_dir(tmp_path / "r0", 1) / safetensors_io.FILE_NAME]
    assert files.versions() == [1]


def test_pruning_keeps_the_newest_two_and_close_removes_everything(tmp_path):
    files = VersionFiles(tmp_path / "r0")
    for version in (1, 2, 3, 4):
        receive(files, version, {"w": torch.full((8,), float(version))})
    files.prune()
    assert files.versions() == [3, 4]
    assert [p.parent.name for p in loadable(tmp_path / "r0")] == ["v000000000003", "v000000000004"]
    files.close()
    assert not (tmp_path / "r0").exists()


def test_a_new_version_reuses_the_file_of_one_the_engine_no_longer_reads(tmp_path):
    files = VersionFiles(tmp_path / "r0")
    receive(files, 1, {"w": torch.full((1024,), 1.0)})
    receive(files, 2, {"w": torch.full((1024,), 2.0)})
    inode_of = {v: os.stat(safetensors_io.version_dir(tmp_path / "r0", v) / "model.safetensors").st_ino for v in (1, 2)}

    # The engine holds version 1 and may still read it: version 3 gets fresh memory.
    receive(files, 3, {"w": torch.full((1024,), 3.0)}, reusable_below=1)
    files.prune()
    assert files.versions() == [2, 3]

    # The engine holds version 3: version 2's file (and its pages) becomes version 4.
    receive(files, 4, {"w": torch.full((1024,), 4.0)}, reusable_below=3)
    four = safetensors_io.version_dir(tmp_path / "r0", 4) / "model.safetensors"
    assert os.stat(four).st_ino == inode_of[2]
    assert not safetensors_io.version_dir(tmp_path / "r0", 2).exists()
    assert torch.equal(load_file(str(four))["w"], torch.full((1024,), 4.0))
    assert files.versions() == [3, 4]


def test_a_reused_file_of_another_size_holds_exactly_the_new_version(tmp_path):
    files = VersionFiles(tmp_path / "r0", keep=1)
    receive(files, 1, {"w": torch.randn(4096)})
    smaller = {"w": torch.randn(10), "b": torch.randn(3).to(torch.bfloat16)}
    directory = receive(files, 2, smaller, reusable_below=2)
    loaded = load_file(str(directory / "model.safetensors"))
    assert all(torch.equal(loaded[k], smaller[k]) for k in smaller)
    assert files.versions() == [2]


def test_a_restarted_replica_starts_from_an_empty_directory(tmp_path):
    receive(VersionFiles(tmp_path / "r0"), 1, STATE)
    assert VersionFiles(tmp_path / "r0").versions() == [] and loadable(tmp_path / "r0") == []
