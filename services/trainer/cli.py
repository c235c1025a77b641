"""``relayrl trainer``: run a trainer rank, and ``relayrl bench trainer``.

Launch a job with ``torchrun --nproc-per-node N -m services.trainer`` (each rank reads
``RELAYRL_TRAINER_*``); ``relayrl trainer run`` without torchrun is a one-rank job.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="The trainer: FSDP2 PPO/GRPO training, checkpoints, publishing versions.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Keeps `run` a sub-command even while it is the only one."""


def device_or_exit(settings: Any) -> None:
    """``device: cuda`` where torch sees no usable GPU: one line naming the setting, exit status 2,
    before any process group, model or server exists (relayrl.devices has the check)."""
    from relayrl.config import SettingsError, env_var_name
    from relayrl.devices import available_device

    try:
        available_device(settings.device)
    except ValueError as exc:
        problem = f"{env_var_name(type(settings), 'device')}: {exc}"
        typer.echo(SettingsError(type(settings).__name__, [problem]).one_line(), err=True)
        raise typer.Exit(2) from None


@app.command("run")
def run_command(
    model_dir: Annotated[Path | None, typer.Option(help="Overrides RELAYRL_TRAINER_MODEL_DIR.")] = None,
    total_steps: Annotated[int | None, typer.Option(help="Overrides RELAYRL_TRAINER_TOTAL_STEPS.")] = None,
) -> None:
    """Run one trainer rank with settings from RELAYRL_TRAINER_* (launch under torchrun for N ranks)."""
    from relayrl.service_cli import settings_or_exit
    from services.trainer.config import TrainerSettings

    settings = settings_or_exit(TrainerSettings, model_dir=model_dir, total_steps=total_steps)
    device_or_exit(settings)
    from relayrl.serving import uncollected_start

    # Imported once the settings are known good: the service pulls in torch, which takes seconds.
    with uncollected_start():
        from services.trainer import distributed as D
        from services.trainer.service import run_service

    state = run_service(settings)
    if os.environ.get("RANK", "0") == "0":
        typer.echo(json.dumps({"step": state.step, "version": state.version}))
    D.exit_rank()


# Defaults of ``relayrl bench trainer`` by device: a CPU run that takes seconds; on a GPU the issue's
# target shape (one GPU, 8 x 8 samples, >= 16k tokens per micro-batch, long responses).
BENCH_DEFAULTS = {
    "cpu": {"world_size": 2, "batch_groups": 4, "n_samples": 4, "prompt_len": 32, "response_len": 64,
            "micro_batch_tokens": 4096},
    "cuda": {"world_size": 0, "batch_groups": 8, "n_samples": 8, "prompt_len": 128, "response_len": 4096,
             "micro_batch_tokens": 16384},
}  # fmt: skip


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line only.")] = False,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    preset: Annotated[
        str, typer.Option(help="Model preset (random init): tiny, small, or base (Qwen2.5-0.5B's shape).")
    ] = "tiny",
    world_size: Annotated[
        int | None, typer.Option(help="FSDP processes (gloo on cpu, NCCL on cuda); cpu 2, cuda every GPU.")
    ] = None,
    steps: Annotated[int, typer.Option(help="Measured steps per configuration.")] = 4,
    batch_groups: Annotated[int | None, typer.Option(help="Groups per step (cpu 4, cuda 8).")] = None,
    n_samples: Annotated[int | None, typer.Option(help="Samples per group (cpu 4, cuda 8).")] = None,
    response_len: Annotated[
        int | None, typer.Option(help="Longest response per sample, tokens (cpu 64, cuda 4096).")
    ] = None,
    prompt_len: Annotated[int | None, typer.Option(help="Prompt tokens per sample (cpu 32, cuda 128).")] = None,
    micro_batch_tokens: Annotated[
        int | None, typer.Option(help="Tokens per micro-batch, ppo_max_token_len_per_gpu (cpu 4096, cuda 16384).")
    ] = None,
    workload: Annotated[
        str, typer.Option(help="Response lengths: uniform (half to all of --response-len) or realistic (long tail).")
    ] = "uniform",
    recompute_old_log_prob: Annotated[
        str, typer.Option(help="auto (skip the proximal forward when redundant) or always.")
    ] = "auto",
    use_remove_padding: Annotated[bool, typer.Option(help="Packed micro-batches (verl's name).")] = True,
    enable_gradient_checkpointing: Annotated[bool, typer.Option(help="verl's name.")] = False,
    use_torch_compile: Annotated[bool, typer.Option(help="verl's name: compile each decoder block.")] = False,
    attn_implementation: Annotated[
        str, typer.Option(help="verl's override_config.attn_implementation: auto, sdpa, flex_attention or eager.")
    ] = "auto",
    single_process: Annotated[bool, typer.Option(help="Also measure the plain model in one process.")] = True,
    profile: Annotated[
        bool,
        typer.Option(
            help="Run one more step under torch.profiler and add where its time went to the JSON (profile: seconds"
            " by kind of kernel, the busiest kernels, on cuda the share of the step the GPU was busy)."
        ),
    ] = False,
    timeout_s: Annotated[
        float | None,
        typer.Option(
            help="After this many seconds measure no further step (each run measures at least one after its"
            " warm-up) and start no plain-model run: the JSON reports the steps measured. Default: no limit."
        ),
    ] = None,
) -> None:
    """Trainer throughput: FSDP over N processes vs one process without FSDP, same work, same run.

    Prints tokens_per_s, single_process_tokens_per_s, fsdp_over_single, world_size, the step-time
    breakdown (wait_s, forward_backward_s, optimizer_s, gather_s) and verl's perf/throughput,
    timing_s/update_weights; with --device cuda also perf/mfu/actor and perf/max_memory_allocated_gb.
    """
    from relayrl.models.tiny import PRESETS

    if preset not in PRESETS:
        raise typer.BadParameter(f"unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if recompute_old_log_prob not in ("auto", "always"):
        raise typer.BadParameter(f"unknown mode {recompute_old_log_prob!r}; choose auto or always")
    if device not in BENCH_DEFAULTS:
        raise typer.BadParameter(f"unknown device {device!r}; choose cpu or cuda")
    if attn_implementation not in ("auto", "sdpa", "flex_attention", "eager"):
        raise typer.BadParameter(
            f"unknown attention {attn_implementation!r}; choose auto, sdpa, flex_attention or eager"
        )
    from relayrl.devices import available_device

    try:
        available_device(device)  # before torchrun: without a GPU it would fail in its worker spec, late and long
    except ValueError as exc:
        typer.echo(f"--device: {exc}", err=True)
        raise typer.Exit(2) from None
    from services.trainer.bench import WORKLOADS, BenchConfig, run_bench

    if workload not in WORKLOADS:
        raise typer.BadParameter(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")
    given = {
        "world_size": world_size,
        "batch_groups": batch_groups,
        "n_samples": n_samples,
        "prompt_len": prompt_len,
        "response_len": response_len,
        "micro_batch_tokens": micro_batch_tokens,
    }
    shape = {k: v if v is not None else BENCH_DEFAULTS[device][k] for k, v in given.items()}
    result = run_bench(
        BenchConfig(
            device=device,
            preset=preset,
            steps=steps,
            recompute_old_log_prob=recompute_old_log_prob,
            workload=workload,
            use_remove_padding=use_remove_padding,
            enable_gradient_checkpointing=enable_gradient_checkpointing,
            use_torch_compile=use_torch_compile,
            attn_implementation=attn_implementation,
            single_process=single_process,
            profile=profile,
            **shape,
        ),
        timeout_s,
    )
    typer.echo(json.dumps(result) if json_output else json.dumps(result, indent=1))
