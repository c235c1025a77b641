"""torch.distributed set-up and the few collectives the trainer uses.

Under torchrun the environment names rank and world size; started without it the trainer
forms a one-process group, so the same FSDP2 code path runs either way. Every helper is a
no-op when no process group exists (the single-process benchmark baseline).
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from relayrl.net import free_port
from services.trainer import determinism

# Rank 0 may wait a long time for data (a paused trainer, slow rollouts) while the other
# ranks sit in a broadcast; gloo's default 30 minutes would kill the job.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=6)


@dataclass(frozen=True, slots=True)
class DistContext:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str, deterministic: bool = False) -> DistContext:
    """Joins (or forms) the process group: NCCL on CUDA, gloo on CPU. ``deterministic`` (the
    trainer's setting) turns torch's deterministic algorithms on first, before CUDA starts."""
    if deterministic:
        determinism.enable()
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT, device_id=dev if device == "cuda" else None)
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), device=dev)


def local_context(device: str = "cpu") -> DistContext:
    """A context with no process group at all (plain single-process training)."""
    return DistContext(rank=0, world_size=1, device=torch.device(device))


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s object on every rank."""
    if not active() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def collective_device() -> torch.device:
    """Where the default group's collectives take their tensors: this rank's GPU under NCCL (which
    moves GPU memory only), the CPU under gloo."""
    if active() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_tensor(t: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Rank ``src``'s tensor (every rank passes one of the same shape and dtype), on ``t``'s device:
    one collective, where ``broadcast_object`` takes two and a pickle."""
    if not active() or dist.get_world_size() == 1:
        return t
    buf = t.to(collective_device())
    dist.broadcast(buf, src=src)
    if buf is not t:
        t.copy_(buf)
    return t


def all_gather_objects(obj: Any) -> list[Any]:
    if not active() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Sum or max of ``t`` over ranks, returned on ``t``'s device (``t`` itself is left alone)."""
    if not active() or dist.get_world_size() == 1:
        return t
    # NCCL reduces only GPU tensors; the trainer's bookkeeping tensors live on the CPU.
    buf = t.to(collective_device(), copy=True)
    dist.all_reduce(buf, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return buf.to(t.device)


def barrier() -> None:
    if active() and dist.get_world_size() > 1:
        dist.barrier()


def shutdown() -> None:
    if active():
        dist.destroy_process_group()


def exit_rank() -> NoReturn:
    """Ends the process of a rank whose work is done and written: the process group goes, logs and
    standard streams are flushed, and the process exits 0 without finalizing the interpreter.

    Finalizing is not safe once gloo has run a collective. Its worker threads outlive
    ``destroy_process_group`` (FSDP2's device mesh keeps the group), and a worker that drops the
    last reference to a finished collective's tensor must take the GIL; during finalization that
    ends the thread inside a noexcept destructor, and the process aborts ("terminate called without
    an active exception", pytorch/pytorch#190489). About one 2-rank job in ten did so after a clean
    run on 2 CPUs, and torchrun then failed the whole job."""
    shutdown()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def get_rank() -> int:
    return dist.get_rank() if active() else 0
