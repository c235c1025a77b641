"""The receiving end of SGLang's ``/update_weights_from_tensor``: named tensors shared by handle.

A trainer on the same machine (the same GPU, with CUDA) sends its tensors as
``torch.multiprocessing`` handles instead of bytes: SGLang's ``MultiprocessingSerializer``
pickles them with ``ForkingPickler`` (a CUDA tensor becomes an IPC handle, a CPU tensor a shared
memory segment) and base64-encodes the result for JSON. ``serialized_named_tensors`` holds one
such string per tensor-parallel rank; the built-in engine is one rank, so exactly one. Its
``load_format``:

- ``None``: a list of ``(name, tensor)`` pairs;
- ``"flattened_bucket"``: one bucket per handle, ``{"flattened_tensor": t, "metadata": [...]}``
  where each metadata entry (SGLang's ``FlattenedTensorMetadata``) names a slice of the flat
  tensor: ``name``, ``shape``, ``dtype``, ``start_idx``, ``end_idx``, ``numel``.

Unpickling runs code the pickle names, so only the classes and functions these payloads need
are allowed (torch's rebuild functions, ``torch.Size``, dtypes, SGLang's metadata class, mapped
onto :class:`FlattenedTensorMetadata`); anything else is refused with a ValueError naming it. A CPU
tensor must be shared with torch's ``file_system`` strategy: the default ``file_descriptor``
strategy passes the descriptor over a socket that only the sender's own children may open.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
from dataclasses import dataclass
from typing import Any

import torch

FLATTENED_BUCKET = "flattened_bucket"

_REBUILDERS = {
    "rebuild_tensor",
    "rebuild_cuda_tensor",
    "rebuild_typed_storage",
    "rebuild_typed_storage_child",
    "rebuild_storage_filename",
    "rebuild_storage_empty",
}
_METADATA_PATHS = {
    ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata"),
    ("sglang.srt.model_executor.model_runner", "FlattenedTensorMetadata"),
    (__name__, "FlattenedTensorMetadata"),
}


@dataclass
class FlattenedTensorMetadata:
    """SGLang's metadata of one tensor in a flattened bucket (the same fields, so its pickles load here)."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


class _HandleUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_PATHS:
            return FlattenedTensorMetadata
        if module == "torch.multiprocessing.reductions" and name in _REBUILDERS:
            return super().find_class(module, name)
        if module == "torch.storage" and name in ("UntypedStorage", "TypedStorage"):
            return super().find_class(module, name)
        if module == "torch" and (
            name in ("Tensor", "Size", "device") or isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        if module == "multiprocessing.resource_sharer" or name == "rebuild_storage_fd":
            raise ValueError(
                "a CPU tensor shared by file descriptor cannot be opened by another process: share it with"
                " torch.multiprocessing.set_sharing_strategy('file_system')"
            )
        raise ValueError(f"{module}.{name} is not allowed in serialized_named_tensors")


def deserialize(serialized: str | bytes) -> Any:
    """SGLang's ``MultiprocessingSerializer.deserialize`` with only the payload's classes allowed."""
    try:
        data = base64.b64decode(serialized, validate=True) if isinstance(serialized, str) else serialized
        return _HandleUnpickler(io.BytesIO(data)).load()
    except (binascii.Error, pickle.UnpicklingError, EOFError, TypeError, AttributeError) as exc:
        raise ValueError(f"serialized_named_tensors is not a serialized tensor payload: {exc}") from exc
    except RuntimeError as exc:  # torch could not open a handle (another device, a freed segment)
        raise ValueError(f"could not open a shared tensor: {exc}") from exc


def named_tensors(serialized_named_tensors: list[str | bytes], load_format: str | None) -> dict[str, torch.Tensor]:
    """The tensors of one update, by name; ValueError on any shape the engine does not take."""
    if len(serialized_named_tensors) != 1:
        raise ValueError(
            f"serialized_named_tensors has {len(serialized_named_tensors)} entries; the built-in engine is one"
            " tensor-parallel rank and takes exactly one"
        )
    payload = deserialize(serialized_named_tensors[0])
    if load_format == FLATTENED_BUCKET:
        buckets = payload if isinstance(payload, list) else [payload]
        return {name: tensor for bucket in buckets for name, tensor in _unflatten(bucket)}
    if load_format is not None:
        raise ValueError(f"load_format {load_format!r} is not supported; use none or {FLATTENED_BUCKET!r}")
    if not isinstance(payload, list | tuple) or not all(_is_named_tensor(item) for item in payload):
        raise ValueError("with load_format none, serialized_named_tensors must hold a list of (name, tensor) pairs")
    return dict(payload)


def flattened_bucket(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The sending side of one ``flattened_bucket`` handle (SGLang's ``FlattenedTensorBucket``): every
    tensor flattened into one (same dtype) and each one's slice described."""
    metadata, offset = [], 0
    for name, tensor in tensors.items():
        numel = tensor.numel()
        metadata.append(FlattenedTensorMetadata(name, tensor.shape, tensor.dtype, offset, offset + numel, numel))
        offset += numel
    return {"flattened_tensor": torch.cat([t.flatten() for t in tensors.values()]), "metadata": metadata}


def serialize(obj: object) -> str:
    """SGLang's ``MultiprocessingSerializer.serialize(obj, output_str=True)``: ForkingPickler, then base64."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions with ForkingPickler)

    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(obj)
    return base64.b64encode(buffer.getvalue()).decode()


def _is_named_tensor(item: Any) -> bool:
    return isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str) and torch.is_tensor(item[1])


def _unflatten(bucket: Any) -> list[tuple[str, torch.Tensor]]:
    if not isinstance(bucket, dict) or not torch.is_tensor(bucket.get("flattened_tensor")):
        raise ValueError("a flattened bucket must be a dict with flattened_tensor and metadata")
    flat, metadata = bucket["flattened_tensor"], bucket.get("metadata")
    if not isinstance(metadata, list) or not all(isinstance(m, FlattenedTensorMetadata) for m in metadata):
        raise ValueError("a flattened bucket's metadata must be a list of FlattenedTensorMetadata")
    tensors = []
    for meta in metadata:
        if not 0 <= meta.start_idx <= meta.end_idx <= flat.numel() or meta.end_idx - meta.start_idx != meta.numel:
            raise ValueError(f"{meta.name}: slice [{meta.start_idx}, {meta.end_idx}) does not fit the bucket")
        tensor = flat[meta.start_idx : meta.end_idx].reshape(meta.shape)
        tensors.append((meta.name, tensor if tensor.dtype == meta.dtype else tensor.to(meta.dtype)))
    return tensors
