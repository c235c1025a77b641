"""``relayrl trainer``: run a trainer rank, and ``relayrl bench trainer``.

Launch a job with ``torchrun --nproc-per-node N -m services.trainer`` (each rank reads
``RELAYRL_TRAINER_*``); ``relayrl trainer run`` without torchrun is a one-rank job.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="The trainer: FSDP2 PPO/GRPO training, checkpoints, publishing versions.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Keeps `run` a sub-command even while it is the only one."""


@app.command("run")
def run_command(
    model_dir: Annotated[Path | None, typer.Option(help="Overrides RELAYRL_TRAINER_MODEL_DIR.")] = None,
    total_steps: Annotated[int | None, typer.Option(help="Overrides RELAYRL_TRAINER_TOTAL_STEPS.")] = None,
) -> None:
    """Run one trainer rank with settings from RELAYRL_TRAINER_* (launch under torchrun for N ranks)."""
    from relayrl.service_cli import settings_or_exit
    from services.trainer.config import TrainerSettings

    settings = settings_or_exit(TrainerSettings, model_dir=model_dir, total_steps=total_steps)
    from relayrl.serving import exit_uncollected, uncollected_start

    # Imported once the settings are known good: the service pulls in torch, which takes seconds.
    with uncollected_start():
        from services.trainer.service import run_service

    state = run_service(settings)
    if os.environ.get("RANK", "0") == "0":
        typer.echo(json.dumps({"step": state.step, "version": state.version}))
    exit_uncollected()


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line only.")] = False,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    preset: Annotated[
        str, typer.Option(help="Model preset (random init): tiny, small, or base (Qwen2.5-0.5B's shape).")
    ] = "tiny",
    world_size: Annotated[int, typer.Option(help="FSDP processes (gloo on cpu, NCCL on cuda).")] = 2,
    steps: Annotated[int, typer.Option(help="Measured steps per configuration.")] = 4,
    batch_groups: Annotated[int, typer.Option(help="Groups per step.")] = 4,
    n_samples: Annotated[int, typer.Option(help="Samples per group.")] = 4,
    response_len: Annotated[int, typer.Option(help="Longest response per sample (lengths vary from half of it).")] = 64,
    prompt_len: Annotated[int, typer.Option(help="Prompt tokens per sample.")] = 32,
    micro_batch_tokens: Annotated[
        int, typer.Option(help="Padded tokens per micro-batch (ppo_max_token_len_per_gpu).")
    ] = 4096,
    recompute_old_log_prob: Annotated[
        str, typer.Option(help="auto (skip the proximal forward when redundant) or always.")
    ] = "auto",
) -> None:
    """Trainer throughput: FSDP over N processes vs one process without FSDP, same work, same run.

    Prints tokens_per_s, single_process_tokens_per_s, world_size and the step-time breakdown
    (wait_s, forward_backward_s, optimizer_s, gather_s); with --device cuda also mfu.
    """
    from relayrl.models.tiny import PRESETS

    if preset not in PRESETS:
        raise typer.BadParameter(f"unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if recompute_old_log_prob not in ("auto", "always"):
        raise typer.BadParameter(f"unknown mode {recompute_old_log_prob!r}; choose auto or always")
    from services.trainer.bench import BenchConfig, run_bench

    result = run_bench(
        BenchConfig(
            device=device,
            preset=preset,
            world_size=world_size,
            steps=steps,
            batch_groups=batch_groups,
            n_samples=n_samples,
            response_len=response_len,
            prompt_len=prompt_len,
            micro_batch_tokens=micro_batch_tokens,
            recompute_old_log_prob=recompute_old_log_prob,
        )
    )
    typer.echo(json.dumps(result) if json_output else json.dumps(result, indent=1))
