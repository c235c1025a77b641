"""``relayrl bench checkpoint``: what a checkpoint every ``save_freq`` steps costs the step loop,
asynchronous (``async_save``) and synchronous, against no checkpoint, in one run.

One trainer process (FSDP2 over one rank, as ``relayrl up`` runs it) trains the same synthetic
batches as ``relayrl bench trainer``, in rounds of ``save_freq`` steps: one round without a
checkpoint, one that takes an asynchronous checkpoint at its first step (the background write
runs beside the round's steps), one with a synchronous checkpoint, and so on in turn, so the three
see the same machine conditions. A round's step time is the mean wall time of its steps, the
checkpoint's own time in the loop included. ``async_ratio`` = async / none, ``sync_ratio`` =
sync / none; ``staging_s`` is what ``save`` held the loop for an async checkpoint and ``durable_s``
how long until that checkpoint was durable (seen at the end of a step, so rounded up to one).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

# torch and the trainer are imported where the bench runs: `relayrl` loads this module to list its
# commands (commands/cli.py), and that must not need torch (`relayrl --help`, a torch-less venv).

MODES = ("none", "async", "sync")


@dataclass(frozen=True)
class CheckpointBenchConfig:
    device: str = "cpu"
    preset: str = "small"
    save_freq: int = 10
    rounds: int = 3  # rounds of save_freq steps per mode
    batch_groups: int = 4
    n_samples: int = 4
    response_len: int = 64
    seed: int = 0


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def run_checkpoint_bench(cfg: CheckpointBenchConfig) -> dict[str, Any]:
    from services.trainer import checkpoint as ckpt
    from services.trainer import distributed as D
    from services.trainer.bench import BenchConfig, make_batch, write_model
    from services.trainer.config import TrainerSettings
    from services.trainer.step import train_step
    from services.trainer.trainer import build_models

    work = Path(tempfile.mkdtemp(prefix="relayrl-ckpt-bench-"))
    batches = BenchConfig(
        device=cfg.device,
        preset=cfg.preset,
        batch_groups=cfg.batch_groups,
        n_samples=cfg.n_samples,
        response_len=cfg.response_len,
        seed=cfg.seed,
    )
    ctx = D.init_distributed(cfg.device)
    settings = TrainerSettings(model_dir=write_model(batches, work / "model"), device=cfg.device)
    models = build_models(settings, ctx)
    vocab = min(models.actor.config.vocab_size, 50000)
    writers = {
        "async": ckpt.Checkpointer(work / "async", keep=2, async_save=True),
        "sync": ckpt.Checkpointer(work / "sync", keep=2, async_save=False),
    }
    step_s: dict[str, list[float]] = {mode: [] for mode in MODES}
    staging, durable = [], []
    train_step(models, make_batch(batches, 0, vocab), settings, pad_id=0)  # warm-up
    step = 0
    for _ in range(cfg.rounds):
        for mode in MODES:
            taken_at = None
            for i in range(cfg.save_freq):
                step += 1
                batch = make_batch(batches, step, vocab)
                _sync(cfg.device)
                started = time.perf_counter()
                train_step(models, batch, settings, pad_id=0)
                if i == 0 and mode != "none":
                    taken_at = time.perf_counter()
                    writers[mode].save(step, models, {"step": step})
                    if mode == "async":
                        staging.append(time.perf_counter() - taken_at)
                elif mode == "async" and taken_at is not None and writers[mode].poll() is not None:
                    durable.append(time.perf_counter() - taken_at)
                    taken_at = None
                _sync(cfg.device)
                step_s[mode].append(time.perf_counter() - started)
            if mode == "async" and taken_at is not None:
                writers[mode].wait()  # the round's steps did not hide the whole write
                durable.append(time.perf_counter() - taken_at)
    for writer in writers.values():
        writer.close()
    latest = ckpt.latest(work / "async")
    size = sum(f.stat().st_size for f in latest.rglob("*") if f.is_file()) if latest is not None else 0
    mean = {mode: statistics.fmean(values) for mode, values in step_s.items()}
    return {
        "bench": "checkpoint",
        **asdict(cfg),
        "world_size": ctx.world_size,
        "params": float(sum(p.numel() for p in models.actor.parameters())),
        "checkpoint_mb": round(size / 2**20, 1),
        "step_s_none": round(mean["none"], 4),
        "step_s_async": round(mean["async"], 4),
        "step_s_sync": round(mean["sync"], 4),
        "async_ratio": round(mean["async"] / mean["none"], 4),
        "sync_ratio": round(mean["sync"] / mean["none"], 4),
        "staging_s": round(statistics.median(staging), 4),
        "durable_s": round(statistics.median(durable), 4),
    }


def bench(
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    preset: Annotated[str, typer.Option(help="Model preset (random init): tiny, small, or base.")] = "small",
    save_freq: Annotated[int, typer.Option(min=2, help="Steps per round; a checkpoint at each round's start.")] = 10,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds per mode (none, async, sync, in turn).")] = 3,
    batch_groups: Annotated[int, typer.Option(min=1, help="Groups per step.")] = 4,
    n_samples: Annotated[int, typer.Option(min=1, help="Samples per group.")] = 4,
    response_len: Annotated[int, typer.Option(min=2, help="Longest response per sample.")] = 64,
) -> None:
    """Step time with a checkpoint every --save-freq steps, asynchronous and synchronous, against none:
    one JSON line (async_ratio, sync_ratio, staging_s, durable_s)."""
    from relayrl.models.tiny import PRESETS

    if preset not in PRESETS:
        raise typer.BadParameter(f"unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    cfg = CheckpointBenchConfig(device, preset, save_freq, rounds, batch_groups, n_samples, response_len)
    from services.trainer import distributed as D

    try:
        typer.echo(json.dumps(run_checkpoint_bench(cfg), sort_keys=True))
    finally:
        D.shutdown()
