"""One trainer rank for the GPU tests (launched by torchrun from test_trainer_gpu.py), on the
trainer's own code path: ``build_models``, ``train_step``, ``stream_weights``, the checkpoint.

``python -m tests.gpu.trainer.worker KIND OUT ARGS...`` where KIND is:

- ``step DEVICE MODEL ESTIMATOR``: one GRPO (grpo) or PPO (gae) step; writes the metrics and the
  weights after it.
- ``publish MODEL ADDRESS BUCKET_BYTES``: one step, then version 1 published to paramsync at ADDRESS
  in the rollout's dtype (bf16 on cuda, cast on the GPU) with the device's staging (pinned host
  buffers, a copy stream); writes the trained (fp32) weights.
- ``lora MODEL ADDRESS``: one step of a LoRA adapter (rank 4), then version 1, the adapter alone,
  published to paramsync at ADDRESS; writes the metrics and the trained adapter.
- ``resume MODEL ROOT PHASE``: PHASE ``through`` trains 4 steps with a checkpoint after the 2nd,
  ``resumed`` loads that checkpoint and trains steps 3 and 4; each writes the last two steps'
  metrics and the final weights.
- ``memory MODEL STEPS``: STEPS steps of a long-tailed batch, each followed by a publish's gather;
  writes the allocated memory after each step and the allocator's peak.
- ``switches MODEL``: one step under each of use_torch_compile and use_remove_padding on and off;
  writes each run's metrics.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters

from services.trainer import checkpoint as ckpt
from services.trainer import distributed as D
from services.trainer.bench import BenchConfig, make_batch
from services.trainer.config import TrainerSettings
from services.trainer.gather import BucketGather
from services.trainer.staging import host_staging
from services.trainer.step import train_step, warm_up
from services.trainer.trainer import build_models, gather_weights, publish_gather, stream_weights
from tests.integration.trainer.fsdp_worker import batch


def _settings(model_dir: str, device: str, **extra: Any) -> TrainerSettings:
    return TrainerSettings(model_dir=Path(model_dir), device=device, lr=1e-3, micro_batch_tokens=24, **extra)


def step(out: str, device: str, model_dir: str, estimator: str) -> dict[str, Any]:
    variant = "vanilla" if estimator == "gae" else "decoupled"
    s = _settings(model_dir, device, adv_estimator=estimator, pg_variant=variant, entropy_coeff=0.01)
    models = build_models(s, D.init_distributed(device))
    metrics = train_step(models, batch(0), s, pad_id=0)
    return {"metrics": metrics, "weights": _weights(models)}


def publish(out: str, model_dir: str, address: str, bucket_bytes: str) -> dict[str, Any]:
    ctx = D.init_distributed("cuda")
    s = _settings(model_dir, "cuda")
    models = build_models(s, ctx)
    train_step(models, batch(0), s, pad_id=0)
    # rollout_dtype auto: bf16 on cuda, each bucket cast on the GPU before its pinned copy.
    dtype = getattr(torch, s.resolved_rollout_dtype)
    gather = BucketGather(int(bucket_bytes), staging=host_staging(ctx.device), dtype=dtype)
    _publish_version_1(models, gather, address)
    return {
        "weights": _weights(models),
        "staging": type(gather.staging).__name__,
        "peak": gather.peak_live_bytes,
        "dtype": dtype,
    }


def lora(out: str, model_dir: str, address: str) -> dict[str, Any]:
    from services.trainer.gather import published_items

    ctx = D.init_distributed("cuda")
    s = _settings(model_dir, "cuda", lora_rank=4, lora_alpha=8, target_modules="q_proj,v_proj,down_proj")
    models = build_models(s, ctx)
    metrics = train_step(models, batch(0), s, pad_id=0)
    _publish_version_1(models, publish_gather(s, ctx.device), address)
    adapter = gather_weights(models.actor, published_items(models.actor))
    return {"metrics": metrics, "adapter": dict(adapter) if adapter is not None else None}


def resume(out: str, model_dir: str, root: str, phase: str) -> dict[str, Any]:
    s = _settings(model_dir, "cuda")
    models = build_models(s, D.init_distributed("cuda"))
    history = []
    first = 0
    if phase == "resumed":
        first = int(ckpt.load(Path(root), models)["step"])
    for n in range(first, 4):
        history.append(train_step(models, batch(n), s, pad_id=0))
        if phase == "through" and n + 1 == 2:
            ckpt.save(Path(root), 2, models, {"step": 2}, keep=2)
    return {"history": history[-2:], "weights": _weights(models)}


def memory(out: str, model_dir: str, steps: str) -> dict[str, Any]:
    ctx = D.init_distributed("cuda")
    s = TrainerSettings(model_dir=Path(model_dir), device="cuda", ppo_max_token_len_per_gpu=16384)
    models = build_models(s, ctx)
    gather = publish_gather(s, ctx.device)
    shape = BenchConfig(preset="base", workload="realistic", batch_groups=4, n_samples=8, prompt_len=128)
    shape = replace(shape, response_len=2048)
    allocated, losses = [], []
    assert warm_up(models, s, pad_id=0)  # as the trainer does at start
    graphs = [int(counters["stats"]["unique_graphs"])]
    torch.cuda.reset_peak_memory_stats()
    for n in range(int(steps)):
        metrics = train_step(models, make_batch(shape, n, 50000), s, pad_id=0)
        stream_weights(models.actor, gather, None, version=n + 1, step=n)
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
        losses.append(metrics["actor/pg_loss"])
        graphs.append(int(counters["stats"]["unique_graphs"]))
    return {"allocated": allocated, "peak": torch.cuda.max_memory_allocated(), "losses": losses, "graphs": graphs}


def switches(out: str, model_dir: str) -> dict[str, Any]:
    ctx = D.init_distributed("cuda")
    runs = {}
    for name, extra in {
        "eager": {},
        "compiled": {"use_torch_compile": True},
        "padded": {"use_remove_padding": False},
        "checkpointed": {"enable_gradient_checkpointing": True},
    }.items():
        s = _settings(model_dir, "cuda", param_dtype="fp32", **extra)
        models = build_models(s, ctx)
        runs[name] = train_step(models, batch(0), s, pad_id=0)
    return runs


def _publish_version_1(models: Any, gather: BucketGather, address: str) -> None:
    """The trainer's streamed publish of version 1 to paramsync at ``address``, waited for."""
    from services.paramsync.client import ParamSyncClient
    from services.trainer.links import IoThread, Publisher

    io = IoThread()

    async def client() -> ParamSyncClient:
        return ParamSyncClient(address)

    publisher = Publisher(io, io.call(client()))
    stream_weights(models.actor, gather, publisher, version=1, step=1)
    publisher.drain()
    record = publisher.records[-1]
    assert record.ok, record.error


def _weights(models: Any) -> dict[str, torch.Tensor] | None:
    weights = gather_weights(models.actor)
    return dict(weights) if weights is not None else None


KINDS = {
    "step": step,
    "publish": publish,
    "lora": lora,
    "resume": resume,
    "memory": memory,
    "switches": switches,
}


def main(kind: str, out: str, *args: str) -> None:
    if kind == "resume":
        # The same kernels in a resumed process as in the one that went on: no nondeterministic choice
        # (cuBLAS needs its workspace fixed before CUDA starts). Only there: inductor keys its cache by
        # this mode, so the other jobs would compile anew what the trainer service's runs compiled.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    result = KINDS[kind](out, *args)
    if D.get_rank() == 0:
        torch.save(result, out)
    D.exit_rank()


if __name__ == "__main__":
    main(*sys.argv[1:])
