"""One rank of a fixed training run (launched by torchrun from test_fsdp_equivalence.py).

Trains ``steps`` steps on the same seeded synthetic batches whatever the world size (and the
trainer's ``param_dtype``, an optional fourth argument) and writes, from rank 0, each step's
metrics and the final full state dict to ``out``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from services.trainer import distributed as D
from services.trainer.batching import TrainSample
from services.trainer.config import TrainerSettings
from services.trainer.step import train_step
from services.trainer.trainer import build_models, gather_weights


def batch(step: int) -> list[TrainSample]:
    rng = random.Random(step)
    samples = []
    for i in range(8):
        n = rng.randint(1, 6)
        rewards = [0.0] * (n - 1) + [rng.random()]
        samples.append(
            TrainSample(
                i // 4,
                [5, 6, 7 + i % 3],
                [rng.randint(10, 60) for _ in range(n)],
                [-rng.uniform(0.5, 3.0) for _ in range(n)],
                rewards,
                rewards[-1],
                0,
            )
        )
    return samples


def main(model_dir: str, out: str, steps: int, param_dtype: str = "auto") -> None:
    torch.set_num_threads(1)
    ctx = D.init_distributed("cpu")
    settings = TrainerSettings(
        model_dir=Path(model_dir),
        lr=1e-3,
        micro_batch_tokens=24,
        ppo_mini_batches=2,
        pg_variant="decoupled",
        use_kl_loss=True,
        entropy_coeff=0.01,
        param_dtype=param_dtype,
    )
    models = build_models(settings, ctx)
    history = [train_step(models, batch(step), settings, pad_id=0) for step in range(steps)]
    weights = gather_weights(models.actor)
    if ctx.is_main:
        torch.save({"history": history, "weights": dict(weights)}, out)
    D.exit_rank()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
