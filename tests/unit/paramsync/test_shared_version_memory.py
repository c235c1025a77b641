"""A version's shared memory is a safetensors file whatever version it held before, and a replica
takes a file for a version only when it carries that version's token."""

from __future__ import annotations

import os
import socket

import pytest
import torch
from safetensors.torch import load

from relayrl.v1 import paramsync_pb2 as pb
from services.paramsync.channels.shared_memory import NotMappable, _open
from services.paramsync.manifest import Manifest
from services.paramsync.memory import SharedVersionMemory, header_room
from services.paramsync.tensors import as_pairs, open_specs

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memory files here")

TENSORS = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(5, dtype=torch.bfloat16)}


def filled(version: int, memory: SharedVersionMemory | None = None) -> tuple[Manifest, SharedVersionMemory]:
    manifest = Manifest(version, tuple(open_specs(as_pairs(TENSORS))))
    memory = memory or SharedVersionMemory(manifest.total_bytes, header_room(manifest))
    memory.write_header(manifest)
    start = 0
    for tensor in TENSORS.values():
        raw = tensor.view(torch.uint8).numpy().tobytes()
        memory.view[start : start + len(raw)] = raw
        start += len(raw)
    return manifest, memory


def shared(memory: SharedVersionMemory, **changes: object) -> pb.SharedVersion:
    fields = {
        "pid": os.getpid(),
        "fd": memory.fd,
        "host": socket.gethostname(),
        "token": memory.token,
        "file_bytes": memory.file_bytes,
    }
    return pb.SharedVersion(**{**fields, **changes})


def test_the_memory_is_a_safetensors_file_of_the_version_it_holds_now() -> None:
    _, memory = filled(1)
    # Reused for a version whose number is much longer: the header still fits its room.
    manifest, memory = filled(10**15, memory)
    got = load(bytes(memory.map))
    assert got.keys() == TENSORS.keys()
    for name, tensor in TENSORS.items():
        assert torch.equal(got[name], tensor)
    mapped = _open(manifest, shared(memory))
    try:
        assert os.pread(mapped.fd, memory.file_bytes, 0) == bytes(memory.map)
    finally:
        mapped.close()


@pytest.mark.parametrize(
    ("changes", "lasting"),
    [({"token": "0" * 32}, False), ({"host": "elsewhere"}, True), ({"fd": 10**6}, False)],
    ids=["another token", "another host", "no such descriptor"],
)
def test_a_file_is_taken_for_the_version_only_with_its_token_on_this_host(
    changes: dict[str, object], lasting: bool
) -> None:
    manifest, memory = filled(3)
    with pytest.raises(NotMappable) as caught:
        _open(manifest, shared(memory, **changes))
    assert caught.value.lasting == lasting
    with pytest.raises(NotMappable):
        _open(Manifest(4, manifest.tensors), shared(memory))  # the right file, another version
