"""Replacing the served model's weights: from a safetensors directory, or by torch.distributed broadcast.

A directory's files are mapped, not read: every tensor is a view into its file's mapping, and
the update copies each straight into its parameter. A version the rollout replica received
into ``/dev/shm`` (``services/paramsync/memfile.py``) thus reaches the parameters with that one
copy, and a real SGLang server can load the same file.

Both paths check every tensor's name and shape against the model before writing any of them,
so a bad update leaves the old weights fully in place. An update may carry a subset of the
tensors (as SGLang allows); the rest keep their values.

The distributed path mirrors SGLang's ``/init_weights_update_group`` +
``/update_weights_from_distributed``: the engine joins a process group (rendezvous over TCP
at ``master_address:master_port``) as rank ``rank_offset`` of ``world_size``, and for each
update receives one ``broadcast`` per tensor from rank 0, in the order of ``names``. On CPU
the backend is gloo. The engine uses the process's default group, so it serves one update
group at a time; the sender joins with ``torch.distributed.init_process_group`` using the
same ``tcp://`` address.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# safetensors' dtype codes (https://github.com/huggingface/safetensors, ``Dtype``).
_SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors_dir(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's ``*.safetensors`` files, as views into the mapped files.

    Nothing is copied here: applying the update is the one copy (into the parameters). A file
    under ``/dev/shm`` is memory already; a file on disk is read from the page cache as it is copied.
    """
    directory = Path(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory} holds no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        tensors.update(map_safetensors(path))
    return tensors


def map_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file as zero-copy views of a private mapping of it.

    The mapping is copy-on-write (``ACCESS_COPY``), so a write through a view never reaches the
    file, which its writer may reuse; each view keeps the mapping alive. ValueError if the file
    is not a well-formed safetensors file.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise ValueError(f"{path} is too short for a safetensors file ({size} bytes)")
        mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    (header_len,) = struct.unpack("<Q", mapping[:8])
    if header_len > size - 8:
        raise ValueError(f"{path}: header of {header_len} bytes in a file of {size}")
    try:
        header = json.loads(mapping[8 : 8 + header_len])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable header: {exc}") from exc
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header is not a JSON object")
    data_start, data_len = 8 + header_len, size - 8 - header_len
    return {
        name: _view(mapping, data_start, data_len, name, entry, path)
        for name, entry in header.items()
        if name != "__metadata__"
    }


def _view(mapping: mmap.mmap, data_start: int, data_len: int, name: str, entry: Any, path: Path) -> torch.Tensor:
    try:
        dtype = _SAFETENSORS_DTYPES[entry["dtype"]]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(o) for o in entry["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: bad header entry for {name!r}: {exc!r}") from exc
    numel = math.prod(shape)
    if any(d < 0 for d in shape) or not 0 <= begin <= end <= data_len or end - begin != numel * dtype.itemsize:
        raise ValueError(f"{path}: {name!r} of shape {list(shape)} does not fit bytes [{begin}, {end}) of {data_len}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(mapping, dtype=dtype, count=numel, offset=data_start + begin).view(shape)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def check_compatible(model: torch.nn.Module, shapes: Mapping[str, Sequence[int]]) -> None:
    """Raises ValueError naming each tensor the model lacks or whose shape differs."""
    params = model.state_dict()
    problems = []
    for name, shape in shapes.items():
        if name not in params:
            problems.append(f"unknown tensor {name!r}")
        elif tuple(params[name].shape) != tuple(shape):
            problems.append(f"{name}: shape {tuple(shape)} != model's {tuple(params[name].shape)}")
    if problems:
        raise ValueError("; ".join(problems[:10]))


@torch.no_grad()
def apply_tensors(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> int:
    """Copies ``tensors`` into the model's parameters and buffers; returns how many were written."""
    check_compatible(model, {name: t.shape for name, t in tensors.items()})
    params = model.state_dict()
    for name, tensor in tensors.items():
        # copy_ converts the dtype on the way: one copy, whatever the received dtype.
        params[name].copy_(tensor)
    return len(tensors)


class DistributedReceiver:
    """The engine's side of a weight-update process group."""

    def __init__(self) -> None:
        self.group_name: str | None = None
        self._lock = threading.Lock()

    def init_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> None:
        with self._lock:
            if self.group_name is not None:
                raise ValueError(f"weight update group {self.group_name!r} already exists; destroy it first")
            if backend != "gloo":
                raise ValueError(f"the CPU engine supports backend 'gloo' only, got {backend!r}")
            dist.init_process_group(
                backend=backend,
                init_method=f"tcp://{master_address}:{master_port}",
                world_size=world_size,
                rank=rank_offset,
                timeout=timedelta(seconds=120),
            )
            self.group_name = group_name

    def receive(
        self, group_name: str, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
    ) -> dict[str, torch.Tensor]:
        """Receives one broadcast from rank 0 per name, in order."""
        if self.group_name != group_name:
            raise ValueError(f"no weight update group {group_name!r} (have {self.group_name!r})")
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError(f"names, dtypes and shapes differ in length: {len(names)}, {len(dtypes)}, {len(shapes)}")
        buffers = {
            name: torch.empty(tuple(shape), dtype=_dtype(dtype))
            for name, dtype, shape in zip(names, dtypes, shapes, strict=True)
        }
        for name in names:
            dist.broadcast(buffers[name], src=0)
        return buffers

    def destroy(self, group_name: str) -> None:
        with self._lock:
            if self.group_name != group_name:
                raise ValueError(f"no weight update group {group_name!r} (have {self.group_name!r})")
            dist.destroy_process_group()
            self.group_name = None
