"""Experiment trackers that receive every training step's metrics (verl's ``trainer.logger``).

``metrics.jsonl`` and Prometheus are not among them: :class:`~services.trainer.telemetry.Telemetry`
always writes those. ``console`` has no writer here either: what a person watches is the progress
line ``relayrl up`` prints from ``metrics.jsonl``. Each tracker's library is imported only when
the tracker is chosen, and only rank 0 builds them (it alone holds the step's metrics).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from relayrl.extras import require

log = logging.getLogger(__name__)


class MetricLogger(Protocol):
    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoardLogger:
    """One scalar per metric key at the global step, in event files under ``<run_dir>/tensorboard``."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._writer: Any = None

    def log(self, step: int, values: Mapping[str, float]) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            # A resumed trainer logs the steps after its checkpoint again; purge_step hides the
            # earlier process's events from this step on, so each step shows one value.
            self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=step)
        for key, value in values.items():
            self._writer.add_scalar(key, value, global_step=step)
        # Flushed every step so `tensorboard --logdir` follows the run live and a crash loses nothing.
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class WandbLogger:
    """A Weights & Biases run per trainer process, named after the run (verl's project/experiment names)."""

    def __init__(self, project: str, name: str, run_dir: Path, config: dict[str, Any]) -> None:
        wandb = require("wandb", "trackers", "trainer.logger wandb")

        # Without credentials an online run would stop at a login prompt (or fail) on a headless
        # trainer; offline still records everything, for `wandb sync` later.
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self._run = wandb.init(
            project=project,
            name=name,
            dir=os.environ.get("WANDB_DIR") or str(run_dir),
            mode=mode,
            config=config,
        )
        log.info("wandb run %s (%s) in %s", self._run.id, mode, self._run.dir)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)

    def close(self) -> None:
        self._run.finish()


def build_loggers(
    backends: Sequence[str], run_dir: Path, project: str, name: str, config: dict[str, Any]
) -> list[MetricLogger]:
    """The trackers named in ``backends`` (the trainer's ``logger`` setting), each built once."""
    loggers: list[MetricLogger] = []
    for backend in dict.fromkeys(backends):
        if backend == "tensorboard":
            # Checked now, not at the first step's write: a missing tracker stops the trainer at start.
            require("tensorboard", "trackers", "trainer.logger tensorboard")
            loggers.append(TensorBoardLogger(run_dir / "tensorboard"))
        elif backend == "wandb":
            loggers.append(WandbLogger(project, name, run_dir, config))
    return loggers
