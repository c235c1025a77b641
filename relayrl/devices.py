"""Where a component computes: ``cpu`` or ``cuda``, one setting with one check.

A device is a setting, not a fork: the trainer and the engine take the same value and run the same
code on it. The check belongs to settings validation so that ``device: cuda`` on a machine without
a usable GPU stops the command at start with one line naming the setting, before any process group,
model or server exists.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator

if TYPE_CHECKING:  # settings modules import this one: torch waits until a tensor moves
    import numpy as np
    import torch

DeviceName = Literal["cpu", "cuda"]


def cuda_unavailable_reason() -> str | None:
    """Why torch cannot compute on CUDA here, or None where it can."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return f"torch {torch.__version__} sees no CUDA device{where}"
    return None


def available_device(value: DeviceName) -> DeviceName:
    """``value`` if this machine can compute on it; raises ValueError (a settings error) otherwise."""
    if value == "cuda" and (reason := cuda_unavailable_reason()) is not None:
        raise ValueError(f"cuda requested but {reason}")
    return value


# The type of every ``device`` setting: validated where it is read, so a bad one never starts work.
Device = Annotated[DeviceName, AfterValidator(available_device)]


def check_bench_device(device: str) -> None:
    """A bench's ``--device``: cpu, or cuda where a GPU is usable; otherwise one line naming the option
    (a usage error), before the bench starts anything."""
    import typer

    if device not in ("cpu", "cuda"):
        raise typer.BadParameter(f"must be cpu or cuda, got {device!r}", param_hint="--device")
    if device == "cuda" and (reason := cuda_unavailable_reason()) is not None:
        raise typer.BadParameter(f"cuda: {reason}", param_hint="--device")


def bench_gpu_name(device: str) -> str | None:
    """The GPU a bench ran on, for its JSON (``gpu``): CUDA's name for the device, None on a CPU."""
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else None


def upload(host: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (a host array or tensor) on ``device``, queued behind the work already launched there
    instead of waiting for it.

    A copy from pageable memory makes torch synchronise the CUDA stream after it, so the host would
    wait for every kernel in flight before it could queue the next (the engine's next pass, the
    trainer's next micro-batch), and the GPU would idle while it did. On CUDA the copy goes through
    pinned memory, asynchronously; torch's pinned allocator keeps that memory until the copy is done.
    A strided view (a sliced mask) is made contiguous first: pinning keeps the strides, and torch would
    copy a strided source through a pageable temporary, the wait above.
    """
    import numpy as np
    import torch

    tensor = torch.from_numpy(host) if isinstance(host, np.ndarray) else host
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.contiguous().pin_memory().to(device, non_blocking=True)
