"""``relayrl ctl``: steer and inspect a running deployment (see commands/ctl/config.py for settings)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from commands.ctl.config import CtlSettings

app = typer.Typer(
    help="Pause, resume, checkpoint and inspect a running deployment (endpoints from RELAYRL_CTL_*).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

_COMPONENTS = ("rollout", "trainer", "queue", "paramsync")
_SERVICE_HELP = "One component: rollout (every replica), trainer, queue or paramsync."
_ALL_HELP = "Every component the action applies to."


def _settings(ctx: typer.Context) -> CtlSettings:
    from commands.ctl.config import CtlSettings
    from relayrl.config import SettingsError, load_settings

    env_file: Path | None = ctx.obj
    overrides = {}
    if env_file is not None:
        if not env_file.is_file():
            _fail(f"--env-file {env_file}: no such file", code=2)
        overrides["_env_file"] = env_file
    try:
        return load_settings(CtlSettings, **overrides)
    except SettingsError as exc:
        _fail(exc.one_line(), code=2)


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"relayrl ctl: {message}", err=True)
    raise typer.Exit(code)


def _targets(service: str | None, all_: bool, allowed: tuple[str, ...], default_all: bool = False) -> list[str]:
    if service is not None and all_:
        _fail("give either --service NAME or --all, not both", code=2)
    if service is None:
        if all_ or default_all:
            return list(allowed)
        _fail(f"choose --service NAME ({', '.join(allowed)}) or --all", code=2)
    if service not in allowed:
        _fail(f"--service {service}: expected one of {', '.join(allowed)}", code=2)
    return [service]


@app.callback()
def main(
    ctx: typer.Context,
    env_file: Path | None = typer.Option(
        None, "--env-file", help="A dotenv file with RELAYRL_CTL_* and RELAYRL_API_TOKEN (environment wins)."
    ),
) -> None:
    ctx.obj = env_file


@app.command()
def status(
    ctx: typer.Context,
    service: str | None = typer.Option(None, "--service", help=_SERVICE_HELP),
    all_: bool = typer.Option(False, "--all", help="Every component (the default)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Versions, staleness, queue depth, throughput and per-replica lag; exit 1 if a component fails."""
    import dataclasses
    import json

    from rich.console import Console

    from commands.ctl.deployment import gather_status
    from commands.ctl.render import print_status

    components = _targets(service, all_, _COMPONENTS, default_all=True)
    settings = _settings(ctx)
    result = gather_status(settings, components)  # type: ignore[arg-type]
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(result), sort_keys=True))
    else:
        print_status(Console(), result)
    if result.failures or result.not_configured:
        raise typer.Exit(1)


def _act(ctx: typer.Context, action: str, components: list[str], **kwargs: str) -> None:
    from rich.console import Console

    from commands.ctl.deployment import act
    from commands.ctl.render import print_outcomes

    outcomes = act(_settings(ctx), action, components, **kwargs)  # type: ignore[arg-type]
    print_outcomes(Console(), outcomes)
    if not all(o.ok for o in outcomes):
        raise typer.Exit(1)


@app.command()
def pause(
    ctx: typer.Context,
    service: str | None = typer.Option(None, "--service", help="rollout or trainer."),
    all_: bool = typer.Option(False, "--all", help="Every rollout replica and the trainer."),
    mode: str = typer.Option(
        "abort", "--mode", help="Rollout pause mode (SGLang's): abort, retract or in_place. Nothing leased is lost."
    ),
) -> None:
    """Stop generation on rollout replicas and/or stop the trainer consuming after its current step."""
    if mode not in ("abort", "retract", "in_place"):
        _fail(f"--mode {mode}: expected abort, retract or in_place", code=2)
    _act(ctx, "pause", _targets(service, all_, ("rollout", "trainer")), mode=mode)


@app.command()
def resume(
    ctx: typer.Context,
    service: str | None = typer.Option(None, "--service", help="rollout or trainer."),
    all_: bool = typer.Option(False, "--all", help="The trainer and every rollout replica."),
) -> None:
    """Resume generation and/or consuming."""
    _act(ctx, "resume", _targets(service, all_, ("rollout", "trainer")))


@app.command()
def checkpoint(
    ctx: typer.Context,
    service: str | None = typer.Option(None, "--service", help="trainer (the only component with checkpoints)."),
    all_: bool = typer.Option(False, "--all", help="Same as --service trainer."),
) -> None:
    """Ask the trainer to checkpoint at the next step that ends on a publish boundary."""
    _act(ctx, "checkpoint", _targets(service, all_, ("trainer",), default_all=True))


@app.command()
def group(
    ctx: typer.Context,
    group_id: str = typer.Argument(help="The group id the agent sent (metadata.group_id, else its conversation id)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Whether an agent's group was trained (step, version), dropped (reason) or is still queued or waiting."""
    import dataclasses
    import json

    from commands.ctl.groups import find_group

    report = find_group(_settings(ctx), group_id)
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(report), sort_keys=True))
    else:
        typer.echo(report.line())
        for failure in report.failures:
            typer.echo(f"  could not ask {failure}", err=True)
    if report.status == "unknown":
        raise typer.Exit(1)
