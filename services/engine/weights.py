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

import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load_file


def read_safetensors_dir(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's ``*.safetensors`` files, as views of the mapped files.

    safetensors maps each file copy-on-write and its tensors view the mapping (a unit test
    checks this), so nothing is copied here: applying the update is the one copy. A file under
    ``/dev/shm`` is memory already; a file on disk is read from the page cache as it is copied.
    ValueError if a file is not a well-formed safetensors file.
    """
    directory = Path(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory} holds no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            tensors.update(load_file(str(path)))
        except SafetensorError as exc:
            raise ValueError(f"{path}: {exc}") from exc
    return tensors


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
