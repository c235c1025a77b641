"""One CPU trainer rank in a torch that reports a GPU as its accelerator, as a GPU host's does
(started by test_cpu_trainer_on_gpu_host.py): it builds the trainer's models, takes a step and
prints, as one JSON line, where the parameters live."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from services.trainer import distributed as D
from services.trainer.config import TrainerSettings
from services.trainer.step import train_step
from services.trainer.trainer import build_models
from tests.integration.trainer.fsdp_worker import batch


def main(model_dir: str) -> None:
    # FSDP2 takes its default device mesh from torch's accelerator; on a GPU host that is CUDA.
    torch._C._get_accelerator = lambda: torch.device("cuda")
    ctx = D.init_distributed("cpu")
    settings = TrainerSettings(model_dir=Path(model_dir), micro_batch_tokens=24, device="cpu")
    models = build_models(settings, ctx)
    train_step(models, batch(0), settings, pad_id=0)
    params = list(models.actor.parameters())
    print(
        json.dumps(
            {
                "mesh": sorted({p.device_mesh.device_type for p in params}),
                "devices": sorted({p.to_local().device.type for p in params}),
            }
        )
    )
    D.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
