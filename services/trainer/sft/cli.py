"""``relayrl sft``: fine-tune a model directory on verl SFT rows; ``--nproc N`` runs N FSDP2 ranks.

With N > 1 the command starts itself under torchrun (``python -m services.trainer.sft`` on each
rank, as the local stack starts the trainer), passing its options on as ``RELAYRL_SFT_*``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from services.trainer.cli import device_or_exit


def _run_here(**options: Any) -> None:
    """This process is one rank (the only one, or one of torchrun's): run it and report on rank 0."""
    from relayrl.models.loading import check_model_dir
    from relayrl.service_cli import settings_or_exit
    from services.trainer.sft.config import SftSettings

    settings = settings_or_exit(SftSettings, **options)
    device_or_exit(settings)
    try:
        # A wrong path is answered before torch and transformers load (seconds on a cold host).
        check_model_dir(settings.model_dir)
    except FileNotFoundError as err:
        typer.echo(f"relayrl sft: {err}", err=True)
        raise typer.Exit(2) from None
    # Imported once the settings are known good: training pulls in torch and transformers.
    from services.trainer.sft.run import run_sft

    try:
        summary = run_sft(settings)
    except (ValueError, FileNotFoundError) as err:
        typer.echo(f"relayrl sft: {err}", err=True)
        raise typer.Exit(2) from None
    if os.environ.get("RANK", "0") == "0":
        typer.echo(json.dumps({"steps": summary.steps, "loss_first": summary.first_loss,
                               "loss_last": summary.last_loss, "out_dir": summary.out_dir}))  # fmt: skip


def _launch(nproc: int, options: dict[str, Any]) -> int:
    """torchrun with ``nproc`` ranks of this command, the options passed on as environment variables."""
    from relayrl.config import env_var_name
    from services.trainer.sft.config import SftSettings

    env = dict(os.environ)
    env.update({env_var_name(SftSettings, k): str(v) for k, v in options.items() if v is not None})
    argv = [
        sys.executable, "-m", "relayrl.torchrun",
        "--standalone", "--nproc-per-node", str(nproc),
        "-m", "services.trainer.sft",
    ]  # fmt: skip
    return subprocess.run(argv, env=env, check=False).returncode


def sft(
    model: Annotated[Path | None, typer.Option("--model", help="Model directory (RELAYRL_SFT_MODEL_DIR).")] = None,
    data: Annotated[
        str | None, typer.Option("--data", help="A verl SFT parquet/jsonl file, or builtin:<task> (RELAYRL_SFT_DATA).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output Hugging Face directory (RELAYRL_SFT_OUT_DIR).")
    ] = None,
    nproc: Annotated[int, typer.Option(min=1, help="FSDP2 ranks; more than 1 starts them under torchrun.")] = 1,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate (RELAYRL_SFT_LR).")] = None,
    train_batch_size: Annotated[
        int | None, typer.Option(help="Sequences per step over all ranks (RELAYRL_SFT_TRAIN_BATCH_SIZE).")
    ] = None,
    micro_batch_size_per_gpu: Annotated[
        int | None, typer.Option(help="Sequences per forward on a rank (RELAYRL_SFT_MICRO_BATCH_SIZE_PER_GPU).")
    ] = None,
    max_length: Annotated[int | None, typer.Option(help="Longest sequence (RELAYRL_SFT_MAX_LENGTH).")] = None,
    truncation: Annotated[
        str | None, typer.Option(help="Longer rows: error, left or right (RELAYRL_SFT_TRUNCATION).")
    ] = None,
    total_epochs: Annotated[int | None, typer.Option(help="Passes over the data (RELAYRL_SFT_TOTAL_EPOCHS).")] = None,
    total_training_steps: Annotated[
        int | None, typer.Option(help="Steps, instead of the epochs' (RELAYRL_SFT_TOTAL_TRAINING_STEPS).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Data order and torch seed (RELAYRL_SFT_SEED).")] = None,
    size: Annotated[int | None, typer.Option(help="Rows of builtin:<task> (RELAYRL_SFT_DATA_SIZE).")] = None,
    difficulty: Annotated[
        int | None, typer.Option(help="Difficulty of builtin:<task> (RELAYRL_SFT_DATA_DIFFICULTY).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu or cuda (RELAYRL_SFT_DEVICE).")] = None,
) -> None:
    """Supervised fine-tuning (verl's SFT data and settings) with FSDP2; writes a Hugging Face directory.

    Every setting is RELAYRL_SFT_<NAME> (services/trainer/sft/config.py); the options override them.
    """
    from relayrl.service_cli import settings_or_exit
    from services.trainer.sft.config import SftSettings

    options = {
        "model_dir": model,
        "data": data,
        "out_dir": out,
        "lr": lr,
        "train_batch_size": train_batch_size,
        "micro_batch_size_per_gpu": micro_batch_size_per_gpu,
        "max_length": max_length,
        "truncation": truncation,
        "total_epochs": total_epochs,
        "total_training_steps": total_training_steps,
        "seed": seed,
        "data_size": size,
        "data_difficulty": difficulty,
        "device": device,
    }
    if nproc == 1:
        _run_here(**options)
        return
    # A bad setting stops here, once, before any rank starts.
    settings = settings_or_exit(SftSettings, **options)
    device_or_exit(settings)
    if settings.train_batch_size % nproc:
        typer.echo(
            f"invalid SftSettings: RELAYRL_SFT_TRAIN_BATCH_SIZE: {settings.train_batch_size} sequences do not"
            f" split evenly over {nproc} ranks",
            err=True,
        )
        raise typer.Exit(2)
    code = _launch(nproc, options)
    if code:
        raise typer.Exit(code)


def run_rank() -> None:
    """One rank under torchrun: every setting comes from RELAYRL_SFT_*."""
    _run_here()
    from services.trainer import distributed as D

    D.exit_rank()
