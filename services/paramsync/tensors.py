"""Turning tensors into raw bytes and back (the only module of the package that needs torch)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from services.paramsync.digest import new_hasher
from services.paramsync.manifest import DTYPE_BYTES, Manifest, TensorSpec

if TYPE_CHECKING:
    import torch


def as_pairs(
    tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> list[tuple[str, torch.Tensor]]:
    """A state dict or (name, tensor) pairs as CPU, contiguous pairs in a fixed order."""
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    return [(name, t.detach().to("cpu").contiguous()) for name, t in items]


def raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (the tensor must be contiguous and on the CPU)."""
    import torch

    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def dtype_name(tensor: torch.Tensor) -> str:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype {name} cannot be published; supported: {', '.join(DTYPE_BYTES)}")
    return name


def build_manifest(
    version: int, pairs: list[tuple[str, torch.Tensor]], trainer_step: int, checksum_algorithm: str
) -> Manifest:
    specs = []
    for name, tensor in pairs:
        data = raw_bytes(tensor)
        hasher = new_hasher(checksum_algorithm)
        hasher.update(data)
        specs.append(TensorSpec(name, dtype_name(tensor), tuple(tensor.shape), data.nbytes, hasher.hexdigest()))
    manifest = Manifest(version, tuple(specs), checksum_algorithm, trainer_step)
    manifest.validate()
    return manifest


def open_specs(pairs: list[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    """The specs of an open manifest: names, dtypes and shapes, checksums to follow with the bytes."""
    return [open_spec(name, t) for name, t in pairs]


def open_spec(name: str, tensor: torch.Tensor) -> TensorSpec:
    """One tensor's spec without its checksum (``tensor`` may be a sharded DTensor: its global shape)."""
    return TensorSpec(name, dtype_name(tensor), tuple(tensor.shape), tensor.numel() * tensor.element_size(), "")


def empty_like_spec(spec: TensorSpec) -> torch.Tensor:
    """An uninitialised byte buffer for one tensor, filled by the receiver."""
    import torch

    return torch.empty(spec.num_bytes, dtype=torch.uint8)


def typed_view(buffer: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """Reinterprets a filled byte buffer as the tensor the manifest describes (no copy)."""
    import torch

    return buffer.view(getattr(torch, spec.dtype)).reshape(spec.shape)
