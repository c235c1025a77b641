"""Which GPU each component of a ``stack.device: cuda`` stack computes on, and how much of it the engines take.

Components are numbered as torchrun and the stack start them: the trainer's P ranks first, then
the N engines. The queue, paramsync and the rollout replicas never touch a GPU.

- **Enough GPUs** (at least P + N): rank r gets GPU r, engine i gets GPU P + i, each alone
  (``CUDA_VISIBLE_DEVICES``), and each engine keeps its own ``mem_fraction_static``.
- **Fewer**: the ranks still get one GPU each (NCCL refuses two ranks on one GPU), and the
  engines share the GPUs left after them, or, where none is left (one GPU), the trainer's, one
  engine per GPU in turn. The stack says so in one line at start.

Memory on a shared GPU (SGLang's rule for ``mem_fraction_static``: an engine fills the GPU up to
that fraction of its memory, counting what other processes already hold, so the fractions of
processes on one GPU are not additive). The engines on a GPU the trainer also uses take
``stack.gpu_memory_utilization`` of it together (verl's name for the rollout's share, default 0.5),
engines on a GPU without the trainer the engine's own default; each of the n engines on a GPU gets
an equal share s, so the k-th one to start (from 0) is given ``(k + 1) · s``, and engines sharing a
GPU start one after another. The trainer keeps what is left: at least ``1 - gpu_memory_utilization``
(whatever it already holds when an engine measures, its CUDA context and weights if loaded by then,
comes out of the engines' share, never the trainer's). An engine section's
``mem_fraction_static`` or ``max_total_tokens`` replaces the rule for every engine. An engine sized
by the rule restarts (after a crash) with the KV cache it sized at its first start, as
``max_total_tokens``: by then the trainer and the engines beside it hold their memory, so the rule
would find no room.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from commands.stack.config import StackConfig

# The engine's own default (services/engine/config.py): the share of engines on a GPU without the trainer.
ENGINE_MEM_FRACTION = 0.88


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """``CUDA_VISIBLE_DEVICES`` of the trainer and of each engine, and each engine's default memory fraction."""

    trainer: tuple[str, ...]
    engines: tuple[str, ...]
    # None: the engine's own default (it is alone on its GPU, or its section sets the memory itself).
    engine_mem_fraction: tuple[float | None, ...]

    @property
    def shared(self) -> bool:
        """Whether two components compute on one GPU."""
        used = [*self.trainer, *self.engines]
        return len(set(used)) < len(used)

    @property
    def engines_beside_trainer(self) -> bool:
        """Whether an engine shares a GPU with the trainer (the stages then run in series on it)."""
        return bool(set(self.trainer) & set(self.engines))

    def engine_beside_first_rank(self, index: int) -> bool:
        """Whether engine ``index`` computes on trainer rank 0's GPU, where the trainer's handles to a
        version point (rank 0 alone keeps the shared copies): only such an engine can open them."""
        return self.engines[index] == self.trainer[0]

    @property
    def gpus(self) -> tuple[str, ...]:
        """Every GPU the stack computes on, in order."""
        return tuple(dict.fromkeys([*self.trainer, *self.engines]))

    @property
    def serial_start(self) -> bool:
        """Whether engines must start one after another (two on one GPU measure each other's memory)."""
        return len(set(self.engines)) < len(self.engines)

    def trainer_env(self) -> dict[str, str]:
        return _visible(self.trainer)

    def engine_env(self, index: int) -> dict[str, str]:
        env = _visible((self.engines[index],))
        if (fraction := self.engine_mem_fraction[index]) is not None:
            env["RELAYRL_ENGINE_MEM_FRACTION_STATIC"] = f"{fraction:.4f}"
        return env

    def sharing_line(self, procs: int) -> str | None:
        """The one line said at start when components share GPUs; None when each has its own."""
        if not self.shared:
            return None
        where = ", ".join(f"engine-{i} on GPU {gpu}" for i, gpu in enumerate(self.engines))
        return (
            f"stack.device cuda: {len(self.gpus)} GPU(s) for {procs} trainer rank(s) and {len(self.engines)}"
            f" engine(s), so they share: trainer on GPU {','.join(self.trainer)}, {where}"
        )

    def describe(self) -> dict[str, object]:
        """The split as the bench reports it."""
        return {"trainer": list(self.trainer), "engines": list(self.engines), "shared": self.shared}


def _visible(gpus: tuple[str, ...]) -> dict[str, str]:
    # PCI bus order unless this process was given another: the ids mean what nvidia-smi and NVML call
    # them (CUDA's own default is fastest first).
    order = os.environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return {"CUDA_DEVICE_ORDER": order, "CUDA_VISIBLE_DEVICES": ",".join(gpus)}


def visible_gpus() -> tuple[str, ...]:
    """The GPUs this process may use: its own ``CUDA_VISIBLE_DEVICES`` if set, else every one torch counts."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return tuple(entry.strip() for entry in visible.split(",") if entry.strip())
    import torch

    return tuple(str(i) for i in range(torch.cuda.device_count()))


def plan_gpus(
    gpus: tuple[str, ...], trainer_procs: int, replicas: int, engines_share: float, engine_sets_memory: bool
) -> GpuPlan:
    """The split of ``gpus`` (see the module docstring); ValueError naming the setting if impossible."""
    if not gpus:
        raise ValueError("stack.gpus: no GPU to use with stack.device cuda")
    if trainer_procs > len(gpus):
        raise ValueError(
            f"stack.trainer_procs={trainer_procs} needs a GPU per rank with stack.device cuda; {len(gpus)} given"
            f" ({','.join(gpus)})"
        )
    trainer = gpus[:trainer_procs]
    pool = gpus[trainer_procs:] or trainer
    engines = tuple(pool[i % len(pool)] for i in range(replicas))
    on_gpu = Counter(engines)
    started: Counter[str] = Counter()
    fractions: list[float | None] = []
    for gpu in engines:
        if engine_sets_memory or (on_gpu[gpu] == 1 and gpu not in trainer):
            fractions.append(None)
            continue
        share = (engines_share if gpu in trainer else ENGINE_MEM_FRACTION) / on_gpu[gpu]
        started[gpu] += 1
        fractions.append(started[gpu] * share)
    return GpuPlan(trainer, engines, tuple(fractions))


def gpu_plan(config: StackConfig) -> GpuPlan | None:
    """The GPU split of a ``stack.device: cuda`` stack (None on CPU); ValueError naming the setting if impossible."""
    settings = config.stack
    if settings.device != "cuda":
        return None
    gpus = tuple(str(g) for g in settings.gpus) if settings.gpus is not None else visible_gpus()
    sets_memory = bool({"mem_fraction_static", "max_total_tokens"} & set(config.engine))
    return plan_gpus(
        gpus,
        settings.trainer_procs,
        settings.rollout_replicas,
        settings.gpu_memory_utilization,
        sets_memory,
    )


def device_problem(config: StackConfig) -> str | None:
    """Why ``config``'s device cannot run on this machine (one line naming the setting), or None."""
    if config.stack.device != "cuda":
        return None
    from relayrl.devices import cuda_unavailable_reason

    if (reason := cuda_unavailable_reason()) is not None:
        return f"stack.device: cuda requested but {reason}"
    try:
        gpu_plan(config)
    except ValueError as exc:
        return str(exc)
    return None
