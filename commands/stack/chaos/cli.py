"""``relayrl chaos``: train under seeded random faults and print what survived, as one JSON line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text: str, option: str = "--duration") -> float:
    """``90s``, ``15m``, ``1h`` or plain seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise typer.BadParameter(f"expected a duration such as 90s, 15m or 1h, got {text!r}", param_hint=option)
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


def chaos(
    duration: Annotated[str, typer.Option(help="How long faults are injected: 90s, 15m, 1h.")] = "15m",
    seed: Annotated[int, typer.Option(help="Seeds the fault schedule and the training run.")] = 0,
    config: Annotated[
        Path | None, typer.Option(help="Stack YAML (sections: stack, queue, ...); default: the demo's.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as one JSON line.")] = False,
    fault_free_runs: Annotated[
        int,
        typer.Option(
            min=1,
            help="Fault-free runs of the same length (seeds S, S+1, ...); the chaos run's reward at "
            "the end is judged against their spread.",
        ),
    ] = 3,
    quiet_tail: Annotated[
        str,
        typer.Option(
            help="After the faults, how long the run goes on without any: the first half drains what they"
            " left; in the second, no group may be thrown away for age (a surplus that never drains)."
        ),
    ] = "60s",
) -> None:
    """Train under SIGKILL, SIGSTOP and network faults, then as many steps without faults; exit 1
    if a group was lost or trained twice, a staleness bound or version order broke, a fault did
    not recover, training stalled for over 30 s, or groups were still thrown away for age once the
    faults were over. ``reward_within_spread`` is reported, not
    judged: how well a run learns is not what surviving faults promises."""
    import json
    import sys

    from commands.stack.chaos.run import passed, run_chaos
    from commands.stack.cli import _load_config

    figures = run_chaos(
        _load_config(config),
        parse_duration(duration),
        seed,
        sink=sys.stderr,
        fault_free_runs=fault_free_runs,
        quiet_s=parse_duration(quiet_tail, "--quiet-tail"),
    )
    if as_json:
        typer.echo(json.dumps(figures, sort_keys=True))
    else:
        typer.echo(json.dumps(figures, indent=1, sort_keys=True))
    raise typer.Exit(0 if passed(figures) else 1)
