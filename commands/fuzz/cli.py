"""``relayrl fuzz``: fuzz every service's gRPC and REST interfaces; one JSON line of figures."""

from __future__ import annotations

import json

import typer


def fuzz(
    calls: int = typer.Option(10_000, min=1, help="Generated calls per gRPC service (REST: per operation, fewer)."),
    service: list[str] = typer.Option(
        [], "--service", help="Fuzz only this service (repeatable): queue, paramsync, rollout, engine, trainer."
    ),
    seed: int = typer.Option(0, help="Seed of every generated request; the same seed makes the same calls."),
    as_json: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Start the services as local processes and fuzz them; exits 1 on any crash, hang, unexplained
    error or lost work."""
    import importlib.util

    from commands.fuzz.run import fuzz as run_fuzz
    from commands.fuzz.targets import ALL_SERVICES

    if importlib.util.find_spec("schemathesis") is None:
        typer.echo("relayrl fuzz: REST fuzzing needs schemathesis: pip install -e '.[dev]' (a dev extra)", err=True)
        raise typer.Exit(2)

    unknown = sorted(set(service) - set(ALL_SERVICES))
    if unknown:
        raise typer.BadParameter(f"unknown service {unknown}; choose from {', '.join(ALL_SERVICES)}")
    result = run_fuzz(calls, tuple(service) or ALL_SERVICES, seed)
    if not as_json:
        verdict = "no crash, hang, unexplained error or lost work" if result["ok"] else "FAILURES (see examples)"
        typer.echo(f"fuzz: {verdict}", err=True)
    typer.echo(json.dumps(result))
    raise typer.Exit(0 if result["ok"] else 1)
