"""``relayrl up`` and ``relayrl demo``: the whole system as local processes."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

DEMO_CONFIG = "configs/demo.yaml"


def _load_config(path: Path | None):
    from relayrl.stack.config import StackConfig

    if path is None:
        with resources.as_file(resources.files("relayrl.stack") / DEMO_CONFIG) as demo:
            return StackConfig.from_yaml(demo)
    if not path.is_file():
        raise typer.BadParameter(f"{path} does not exist", param_hint="--config")
    return StackConfig.from_yaml(path)


def up(
    config: Annotated[
        Path | None, typer.Option(help="Stack YAML (sections: stack, queue, ...); default: the demo's.")
    ] = None,
    run_id: Annotated[str | None, typer.Option(help="Run name (default: timestamped).")] = None,
    keep_alive: Annotated[bool, typer.Option(help="Keep the services up after the trainer finishes.")] = False,
) -> None:
    """Start redis, queue, paramsync, N engines + rollout replicas and the trainer; Ctrl-C stops all."""
    from relayrl.stack.run import run_stack

    stack_config = _load_config(config)
    if run_id:
        stack_config.stack.run_id = run_id
    raise typer.Exit(run_stack(stack_config, quiet=False, keep_alive=keep_alive).exit_code)


def demo(
    config: Annotated[Path | None, typer.Option(help="Stack YAML overriding the built-in demo config.")] = None,
    run_id: Annotated[str | None, typer.Option(help="Run name (default: timestamped).")] = None,
    verbose: Annotated[bool, typer.Option(help="Show every component's log lines too.")] = False,
) -> None:
    """Async GRPO of the built-in tiny model on a built-in task; writes runs/<id>/report.json and reward.png."""
    from relayrl.stack.run import run_stack

    stack_config = _load_config(config)
    if run_id:
        stack_config.stack.run_id = run_id
    outcome = run_stack(stack_config, quiet=not verbose, keep_alive=False, report=True)
    if outcome.report is not None:
        r = outcome.report
        typer.echo(
            f"\nreward {r.reward_first:.3f} -> {r.reward_last:.3f} (rise {r.reward_rise:+.3f}) over {r.steps} steps"
            f" in {r.wall_s:.0f}s; max sample age {r.max_sample_age:.0f} (η = {r.max_staleness})"
        )
        typer.echo(f"report: {outcome.run_dir / 'report.json'}\nplot:   {outcome.run_dir / 'reward.png'}")
    raise typer.Exit(outcome.exit_code)
