"""``relayrl chaos``: train under seeded random faults and print what survived, as one JSON line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``1h`` or plain seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise typer.BadParameter(f"expected a duration such as 90s, 15m or 1h, got {text!r}", param_hint="--duration")
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


def chaos(
    duration: Annotated[str, typer.Option(help="How long faults are injected: 90s, 15m, 1h.")] = "15m",
    seed: Annotated[int, typer.Option(help="Seeds the fault schedule and the training run.")] = 0,
    config: Annotated[
        Path | None, typer.Option(help="Stack YAML (sections: stack, queue, ...); default: the demo's.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as one JSON line.")] = False,
) -> None:
    """Train under SIGKILL, SIGSTOP and network faults, then the same run fault-free; exit 1 if
    a group was lost or trained twice, a staleness bound or version order broke, a fault did not
    recover, or training stalled for over 30 s."""
    import json
    import sys

    from relayrl.stack.chaos.run import passed, run_chaos
    from relayrl.stack.cli import _load_config

    figures = run_chaos(_load_config(config), parse_duration(duration), seed, sink=sys.stderr)
    if as_json:
        typer.echo(json.dumps(figures, sort_keys=True))
    else:
        typer.echo(json.dumps(figures, indent=1, sort_keys=True))
    raise typer.Exit(0 if passed(figures) else 1)
