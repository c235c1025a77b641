"""``relayrl replay RUN``: re-runs a run's trainer from its trajectory log (services/trainer/replay.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from services.trainer.replay import CUDA_TOLERANCE


def replay(
    run: Annotated[Path, typer.Argument(help="The run directory (runs/<run_id>) of a finished or crashed run.")],
    until_step: Annotated[
        int | None, typer.Option(min=1, help="Last step to replay (default: the last step the log holds).")
    ] = None,
    from_step: Annotated[
        int | None,
        typer.Option(
            min=0, help="Start from checkpoint step_M (0: the model directory; default: the earliest the log allows)."
        ),
    ] = None,
    extra_metrics: Annotated[
        str,
        typer.Option(
            help="Comma-separated metrics the original did not log, dumped per token for --dump-step: entropy,"
            " ratios (both: per-token log-probs, log ratio to the behaviour policy, entropy)."
        ),
    ] = "",
    dump_step: Annotated[
        list[int] | None,
        typer.Option(min=1, help="A step whose tokens --extra-metrics dumps (repeatable; default: the last replayed)."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Output directory (default replays/<run name>-<UTC time>; never inside RUN).")
    ] = None,
    tolerance: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Largest max_rel_diff (per tensor, ‖replayed − original‖ / ‖original‖) accepted where the replay"
            " cannot be bit for bit: a CUDA run without deterministic algorithms, or replayed on another GPU model"
            f" or torch. Default {CUDA_TOLERANCE:g}.",
        ),
    ] = None,
) -> None:
    """Re-run a run's trainer from its config, a starting checkpoint and its trajectory log: no engine, no queue.

    Prints one JSON line (the report): each checkpoint of the run within the replayed steps with the SHA-256 of
    its actor weights and the replay's, their largest differences, and whether they match. They must be equal
    bit for bit on CPU, and on CUDA when the run had deterministic: true (same GPU model and torch); otherwise
    within --tolerance of max_rel_diff. Exits 1 when one does not match; bad input stops with one line naming
    what is missing. Nothing in RUN is written.
    """
    from services.trainer.replay import EXTRA_METRICS, ReplayError, plan_replay, run_replay

    wanted = tuple(name.strip() for name in extra_metrics.split(",") if name.strip())
    if unknown := [name for name in wanted if name not in EXTRA_METRICS]:
        raise typer.BadParameter(f"unknown {', '.join(unknown)}; choose from {', '.join(EXTRA_METRICS)}")
    out_dir = out or Path("replays") / f"{run.resolve().name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    if out_dir.resolve().is_relative_to(run.resolve()):
        raise typer.BadParameter(f"{out_dir} lies inside the run directory; a replay changes nothing there")
    try:
        plan = plan_replay(run, from_step, until_step)
    except ReplayError as err:
        typer.echo(f"relayrl replay: {err}", err=True)
        raise typer.Exit(2) from None
    report = run_replay(plan, out_dir, wanted, tuple(dump_step or [plan.until_step]), tolerance)
    typer.echo(json.dumps(report))
    if not report["reproduced"]:
        differ = [c["step"] for c in report["checkpoints"] if not c["within"]]
        bound = report["tolerance"]
        how = "differ from" if bound is None else f"are beyond {bound['measure']} {bound['value']:g} of"
        typer.echo(f"relayrl replay: the replayed weights {how} the checkpoints at steps {differ}", err=True)
        raise typer.Exit(1)
