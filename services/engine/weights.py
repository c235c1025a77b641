"""Replacing the served model's weights with tensors from a safetensors directory or a broadcast.

A directory's files are mapped, not read: every tensor is a view into its file's mapping, and
the update copies each straight into its parameter. A version the rollout replica received
into ``/dev/shm`` (``services/paramsync/memfile.py``) thus reaches the parameters with that one
copy, and a real SGLang server can load the same file.

Both paths check every tensor's name and shape against the model before writing any of them,
so a bad update leaves the old weights fully in place. An update may carry a subset of the
tensors (as SGLang allows); the rest keep their values.

The broadcast's receiving end (SGLang's ``/init_weights_update_group`` +
``/update_weights_from_distributed``) lives beside its sending end in paramsync's ``torch_dist``
channel (``services/paramsync/channels/torch_dist.py``); the tensors it receives are applied here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
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
