"""Which CPUs the engines and the trainer may use, so the two stages do not steal each other's cores.

On a machine with few cores an engine's decode threads and the trainer's forward/backward threads
otherwise land on the same cores and slow each other down unpredictably. The stack pins each
heavy stage to its own CPU set and sizes its torch intra-op threads to that set (the engine's
``torch_threads``, the trainer's ``OMP_NUM_THREADS``). The light services (redis, queue,
paramsync, rollout replicas) share the engines' CPUs: their work comes and goes with generation,
and the engines' set has slack whenever generation outpaces training, whereas every cycle they
take from the trainer's set comes straight off the training rate.

``stack.cpus`` is ``auto`` (half the CPUs to the engines, the rest to the trainer: on 2 cores
one each), ``off`` (no pinning; every process sees every CPU, one torch thread each), or the
two sets spelled out (``{engines: [0], trainer: [1, 2, 3]}``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class CpuSets(BaseModel):
    """Explicit CPU sets; the engines share theirs."""

    model_config = ConfigDict(extra="forbid")

    engines: list[int] = Field(min_length=1, description="CPU ids the engines run on.")
    trainer: list[int] = Field(min_length=1, description="CPU ids the trainer's ranks run on.")


CpusSetting = Literal["auto", "off"] | CpuSets


@dataclass(frozen=True, slots=True)
class CpuPlan:
    """CPU sets (None: not pinned) and torch intra-op threads per process of each stage."""

    engine_cpus: tuple[int, ...] | None
    engine_threads: int
    trainer_cpus: tuple[int, ...] | None
    trainer_threads: int

    @property
    def service_cpus(self) -> tuple[int, ...] | None:
        """Where redis, the queue, paramsync and the rollout replicas run."""
        return self.engine_cpus

    def describe(self) -> dict[str, object]:
        """The split as the bench reports it."""
        return {
            "engines": list(self.engine_cpus) if self.engine_cpus else "all",
            "engine_threads": self.engine_threads,
            "trainer": list(self.trainer_cpus) if self.trainer_cpus else "all",
            "trainer_threads_per_rank": self.trainer_threads,
            "services": list(self.service_cpus) if self.service_cpus else "all",
        }


def available_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def plan_cpus(
    setting: CpusSetting, replicas: int, trainer_procs: int, available: tuple[int, ...] | None = None
) -> CpuPlan:
    """The split for ``replicas`` engines and ``trainer_procs`` trainer ranks; ValueError if impossible."""
    cpus = available if available is not None else available_cpus()
    if setting == "off" or (setting == "auto" and len(cpus) < 2):
        return CpuPlan(None, 1, None, 1)
    if setting == "auto":
        half = len(cpus) // 2
        engines, trainer = cpus[:half], cpus[half:]
    else:
        assert isinstance(setting, CpuSets)
        unknown = sorted(set(setting.engines + setting.trainer) - set(cpus))
        if unknown:
            raise ValueError(f"stack.cpus names CPUs {unknown} this process may not use (it may use {list(cpus)})")
        engines, trainer = tuple(sorted(set(setting.engines))), tuple(sorted(set(setting.trainer)))
    return CpuPlan(
        engine_cpus=engines,
        engine_threads=max(1, len(engines) // replicas),
        trainer_cpus=trainer,
        trainer_threads=max(1, len(trainer) // trainer_procs),
    )
