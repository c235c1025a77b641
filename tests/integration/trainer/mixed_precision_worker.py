"""One FSDP2 rank that trains one step with bf16 compute (``param_dtype: bf16``, launched by torchrun
from test_mixed_precision.py) and writes to OUT the dtypes it saw: the decoder blocks' compute, the
gradients the optimizer stepped with, the master weights and the optimizer's state."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from services.trainer import distributed as D
from services.trainer.config import TrainerSettings
from services.trainer.step import train_step
from services.trainer.trainer import build_models
from tests.integration.trainer.fsdp_worker import batch


def _dtypes(tensors) -> list[str]:
    return sorted({str(t.dtype) for t in tensors})


def main(model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    ctx = D.init_distributed("cpu")
    settings = TrainerSettings(model_dir=Path(model_dir), param_dtype="bf16", lr=1e-3)
    models = build_models(settings, ctx)
    compute: list[torch.dtype] = []
    models.actor.model.layers[0].mlp.register_forward_hook(lambda _m, args, _out: compute.append(args[0].dtype))
    grads: list[str] = []
    models.actor_opt.register_step_pre_hook(
        lambda *_: grads.extend(_dtypes(p.grad for p in models.actor.parameters() if p.grad is not None))
    )
    train_step(models, batch(0), settings, pad_id=0)
    state = [v for s in models.actor_opt.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
    result = {
        "compute": sorted({str(d) for d in compute}),
        "grads": sorted(set(grads)),
        "weights": _dtypes(models.actor.parameters()),
        "optimizer_state": _dtypes(state),
        "optimizer_tensors": len(state),
    }
    if ctx.is_main:
        torch.save(result, out)
    D.exit_rank()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
