"""Replacing the served model's weights with tensors from a safetensors directory or a broadcast.

A directory's files are mapped, not read: every tensor is a view into its file's mapping, and
the update copies each straight into its parameter. A version the rollout replica received
into ``/dev/shm`` (``services/paramsync/memfile.py``) thus reaches the parameters with that one
copy, and a real SGLang server can load the same file. Where the engine is told that files do not
change while it serves them (its ``shared_weights_dir``, the replica's memory directory), a whole
version is not copied at all: each parameter becomes the tensor viewing the file, so the file's
memory is the model's and the update only repoints the parameters.

Both paths check every tensor's name and shape against the model before writing any of them,
so a bad update leaves the old weights fully in place. An update may carry a subset of the
tensors (as SGLang allows); the rest keep their values.

On CUDA a directory's files take one host-to-device copy each (:func:`read_safetensors_to_device`):
a file is the bucket paramsync wrote, its tensors become views of the copy on the device, and the
update itself (on the scheduler thread, between two steps) is then a device-to-device copy per
parameter, so generation pauses for that copy only.

The broadcast's receiving end (SGLang's ``/init_weights_update_group`` +
``/update_weights_from_distributed``) lives beside its sending end in paramsync's ``torch_dist``
channel (``services/paramsync/channels/torch_dist.py``); the tensors it receives are applied here.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

PAGE_BYTES = mmap.PAGESIZE


def read_safetensors_dir(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's ``*.safetensors`` files, as views of the mapped files.

    safetensors maps each file copy-on-write and its tensors view the mapping (a unit test
    checks this), so nothing is copied here: applying the update is the one copy, or none. Every
    page is read once here (a file on disk from the page cache), because this runs beside
    generation while the update runs between two of its steps: a page first touched there would
    hold generation up. ValueError if a file is not a well-formed safetensors file.
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
    for tensor in tensors.values():
        _read_every_page(tensor)
    return tensors


# safetensors' dtype names.
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors_to_device(directory: str | Path, device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's ``*.safetensors`` files on ``device``, each file's tensor bytes
    copied there in one host-to-device copy (the tensors are views into it). ValueError if a file
    is not a well-formed safetensors file."""
    directory = Path(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory} holds no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        tensors.update(_file_to_device(path, device))
    return tensors


def _file_to_device(path: Path, device: torch.device) -> dict[str, torch.Tensor]:
    # Copy-on-write, as safetensors maps: writable for torch, and nothing is written.
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
        try:
            header_len = int.from_bytes(mapped[:8], "little")
            header = json.loads(mapped[8 : 8 + header_len])
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not a safetensors file ({exc})") from exc
        start = 8 + header_len
        host = torch.frombuffer(mapped, dtype=torch.uint8, offset=start) if len(mapped) > start else torch.empty(0)
        # The one copy of the whole data section (a copy on CPU too: the mapping closes below).
        data = host.to(device, copy=True)
        del host
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = _DTYPES[entry["dtype"]], entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: bad header entry for {name!r}: {exc}") from exc
        tensors[name] = data[begin:end].view(dtype).reshape(shape)
    return tensors


def _read_every_page(tensor: torch.Tensor) -> None:
    """Faults the mapping's pages under ``tensor`` in (one byte read per page; no copy)."""
    if tensor.numel():
        tensor.reshape(-1).view(torch.uint8)[::PAGE_BYTES].sum()


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
def apply_tensors(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor], in_place: bool = False) -> int:
    """Writes ``tensors`` into the model's parameters and buffers; returns how many were written.

    Each is copied, converting its dtype on the way. With ``in_place``, an update that names every
    parameter (a whole version) is served from the received tensors themselves: each parameter of
    the same dtype becomes its tensor (``param.data``; tied parameters are one object, so both
    names follow), and the memory the model held before is freed. The caller promises the memory
    under the tensors does not change while they are served. A partial update is always copied:
    served in place, it would leave the model spread over several versions' files.
    """
    check_compatible(model, {name: t.shape for name, t in tensors.items()})
    targets = model.state_dict(keep_vars=True)
    whole = in_place and all(name in tensors for name, _ in model.named_parameters())
    for name, tensor in tensors.items():
        target = targets[name]
        if whole and isinstance(target, torch.nn.Parameter) and _servable(tensor, target):
            target.data = tensor
        else:
            target.copy_(tensor)
    return len(tensors)


def _servable(tensor: torch.Tensor, param: torch.Tensor) -> bool:
    """Whether ``tensor`` can stand as ``param``'s data as it is (else it is copied)."""
    return (
        tensor.dtype == param.dtype
        and tensor.device == param.device
        and tensor.is_contiguous()
        and tensor.data_ptr() % tensor.element_size() == 0
    )
