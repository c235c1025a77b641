"""Deterministic algorithms for a trainer whose run must replay bit for bit on a GPU.

On a CPU the trainer's arithmetic is the same from run to run already (one rank, the same torch
threads). On CUDA some kernels are not: atomic adds in reductions (an embedding's or a scatter's
backward), cuBLAS splitting a matrix product across a workspace, inductor choosing a kernel
configuration by timing. With the trainer's ``deterministic`` setting, torch picks deterministic
kernels everywhere (``use_deterministic_algorithms``; inductor follows it) and raises on an op
that has none, rather than warn: a run that says it is deterministic never silently is not.
cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` when it makes its first handle, so :func:`enable` runs
before CUDA starts (:func:`services.trainer.distributed.init_distributed` calls it first).
"""

from __future__ import annotations

import os

import torch

# cuBLAS's deterministic workspace settings (its documentation's two choices).
CUBLAS_WORKSPACE_CONFIGS = (":4096:8", ":16:8")


def enable() -> None:
    """Turns torch's deterministic algorithms on for this process; RuntimeError once CUDA has
    started, since cuBLAS would keep the workspace it already chose."""
    if torch.cuda.is_initialized():
        raise RuntimeError("deterministic algorithms must be enabled before CUDA initialises")
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in CUBLAS_WORKSPACE_CONFIGS:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIGS[0]
    torch.use_deterministic_algorithms(True, warn_only=False)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def enabled() -> bool:
    """Whether this process computes with deterministic algorithms only."""
    return torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
