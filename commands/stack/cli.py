"""``relayrl up`` and ``relayrl demo``: the whole system as local processes."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

DEMO_CONFIG = "configs/demo.yaml"


# A config that cannot run exits with this code, like a usage error.
BAD_CONFIG_EXIT = 2

DebugOption = Annotated[bool, typer.Option("--debug", help="Show the traceback of a config error.")]


def _load_config(path: Path | None, debug: bool = False):
    """The checked config (see ``relayrl check``); a bad one prints one block and exits 2."""
    from commands.stack.check import ConfigError, load_checked
    from commands.stack.gpus import device_problem

    try:
        if path is None:
            with resources.as_file(resources.files("commands.stack") / DEMO_CONFIG) as demo:
                return load_checked(demo)
        config = load_checked(path)
        # The machine, not the file: checked here so that configs for a GPU host parse everywhere.
        if problem := device_problem(config):
            raise ConfigError(str(path), [problem])
        return config
    except ConfigError as err:
        if debug:
            raise
        typer.echo(str(err), err=True)
        raise typer.Exit(BAD_CONFIG_EXIT) from None


def check(
    config: Annotated[Path, typer.Option(help="Stack YAML to check.")],
    debug: DebugOption = False,
) -> None:
    """Check a stack config as `relayrl up` does before starting anything; exit 2 when it cannot run."""
    _load_config(config, debug)
    typer.echo(f"{config}: ok")


VerboseOption = Annotated[bool, typer.Option(help="Show every component's log lines too (always in runs/<id>/logs/).")]


def up(
    config: Annotated[
        Path | None, typer.Option(help="Stack YAML (sections: stack, queue, ...); default: the demo's.")
    ] = None,
    run_id: Annotated[str | None, typer.Option(help="Run name (default: timestamped).")] = None,
    model_dir: Annotated[
        Path | None,
        typer.Option(help="Train this Hugging Face model directory (stack.model_dir), e.g. `relayrl sft`'s output."),
    ] = None,
    keep_alive: Annotated[bool, typer.Option(help="Keep the services up after the trainer finishes.")] = False,
    resume: Annotated[
        str | None,
        typer.Option(help="Continue a stopped run (runs/<id> or its id) from its checkpoint, with its saved config."),
    ] = None,
    monitor: Annotated[
        bool, typer.Option(help="Also start a local Prometheus scraping every component (see README).")
    ] = False,
    verbose: VerboseOption = False,
    debug: DebugOption = False,
) -> None:
    """Start redis, queue, paramsync, N engines + rollout replicas and the trainer; Ctrl-C stops all.

    Writes runs/<id>/report.json and reward.png when the trainer finishes."""
    if resume is not None:
        _run(_resumed_config(resume, config, debug), verbose, keep_alive, title="RelayRL", monitor=monitor)
    stack_config = _load_config(config, debug)
    if run_id:
        stack_config.stack.run_id = run_id
    if model_dir is not None:
        from relayrl.models.loading import check_model_dir

        try:
            check_model_dir(model_dir)
        except FileNotFoundError as err:
            typer.echo(f"--model-dir: {err}", err=True)
            raise typer.Exit(BAD_CONFIG_EXIT) from None
        stack_config.stack.model_dir = model_dir
    _run(stack_config, verbose, keep_alive, title="RelayRL", monitor=monitor)


def demo(
    config: Annotated[Path | None, typer.Option(help="Stack YAML overriding the built-in demo config.")] = None,
    run_id: Annotated[str | None, typer.Option(help="Run name (default: timestamped).")] = None,
    verbose: VerboseOption = False,
    debug: DebugOption = False,
) -> None:
    """Async GRPO of the built-in tiny model on a built-in task; writes runs/<id>/report.json and reward.png."""
    stack_config = _load_config(config, debug)
    if run_id:
        stack_config.stack.run_id = run_id
    _run(stack_config, verbose, keep_alive=False, title="RelayRL demo")


def _resumed_config(resume: str, config: Path | None, debug: bool):
    from commands.stack.resume import ResumeError, find_run, finished_step, resume_line

    if config is not None:
        raise typer.BadParameter("a resumed run uses its saved config; leave out --config", param_hint="--resume")
    try:
        run_dir = find_run(resume)
    except ResumeError as err:
        raise typer.BadParameter(str(err), param_hint="--resume") from None
    from commands.stack.export import RUN_CONFIG

    stack_config = _load_config(run_dir / RUN_CONFIG, debug)
    stack_config.stack.runs_dir = run_dir.resolve().parent
    stack_config.stack.run_id = run_dir.resolve().name
    total = int(stack_config.trainer.get("total_steps", 100))
    done = finished_step(run_dir, total)
    if done is not None:
        # Nothing starts and nothing is rewritten: the run's report stays the one it finished with.
        typer.echo(f"{run_dir.name} already finished ({done} of {total} steps); nothing to resume")
        typer.echo(f"report: {run_dir / 'report.json'}")
        raise typer.Exit(0)
    typer.echo(resume_line(run_dir))
    return stack_config


def _run(stack_config, verbose: bool, keep_alive: bool, title: str, monitor: bool = False) -> None:
    from commands.stack.run import run_stack

    outcome = run_stack(
        stack_config, quiet=not verbose, keep_alive=keep_alive, report=True, title=title, monitor=monitor
    )
    if outcome.report is not None:
        r = outcome.report
        span = (
            f"{r.span_steps} steps"
            if not r.resumed_from_step
            else (
                f"{r.span_steps} steps ({r.resumed_from_step + 1}-{r.steps}, resumed from step {r.resumed_from_step})"
            )
        )
        typer.echo(
            f"\nreward {r.reward_first:.3f} -> {r.reward_last:.3f} (rise {r.reward_rise:+.3f}) over {span}"
            f" in {r.wall_s:.0f}s; max sample age {r.max_sample_age:.0f} (η = {r.max_staleness})"
        )
        if (note := r.stall_note()) is not None:
            typer.echo(note)
        typer.echo(f"report: {outcome.run_dir / 'report.json'}\nplot:   {outcome.run_dir / 'reward.png'}")
    raise typer.Exit(outcome.exit_code)


def export(
    run_dir: Annotated[Path, typer.Argument(help="The run directory, runs/<id>.")],
    out_dir: Annotated[Path, typer.Argument(help="Where to write the Hugging Face model directory.")],
    step: Annotated[int | None, typer.Option(help="Checkpoint step to export (default: the latest).")] = None,
    merge_lora: Annotated[
        bool,
        typer.Option(
            help="LoRA runs: merge the adapter into the base weights (a plain Hugging Face directory) instead of"
            " writing the adapter in peft's format."
        ),
    ] = False,
    with_base: Annotated[
        bool,
        typer.Option(
            help="LoRA adapter exports: copy the base model into OUT_DIR/base and point the adapter at it, so"
            " the export outlives the run directory (default: the base model's absolute path)."
        ),
    ] = False,
) -> None:
    """Write a run's policy (latest or --step checkpoint) as a Hugging Face model directory (a LoRA run's: its
    adapter in peft's format, or merged with --merge-lora)."""
    import json

    from commands.stack.export import ExportError, export_policy

    try:
        checkpoint = export_policy(run_dir, out_dir, step, merge_lora, with_base)
    except ExportError as err:
        typer.echo(f"export: {err}", err=True)
        raise typer.Exit(BAD_CONFIG_EXIT) from None
    if (out_dir / "adapter_config.json").is_file():
        base = json.loads((out_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
        typer.echo(
            f"{out_dir}: LoRA adapter of {checkpoint.name} and its tokenizer, on base model {base}"
            " (peft.AutoPeftModelForCausalLM.from_pretrained loads it)"
        )
    else:
        typer.echo(f"{out_dir}: policy of {checkpoint.name} (AutoModelForCausalLM.from_pretrained loads it)")
