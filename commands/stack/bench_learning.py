"""``relayrl bench learning``, the command: one config's seeds (:mod:`commands.stack.learning`) or,
with ``--against``, two configs' seeds interleaved and paired (:mod:`commands.stack.learning_pairs`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from commands.stack import learning
from commands.stack.config import StackConfig
from commands.stack.learning import DEMO_TARGET, PLOT_NAME, plot_seeds, render_table, result_json, run_seeds, summarize
from commands.stack.learning_pairs import pair, pairs_json, render_pairs, run_pairs


def bench(
    seeds: Annotated[
        int, typer.Option(min=1, help="Number of seeds, run one after another (with --against, each with both).")
    ],
    config: Annotated[
        Path | None, typer.Option(help="Stack YAML, as `relayrl up --config` reads it; default: the demo's.")
    ] = None,
    against: Annotated[
        Path | None,
        typer.Option(
            help="A second stack YAML (config B) run on the same seeds, interleaved seed by seed with --config"
            " (config A), and compared with it run by run."
        ),
    ] = None,
    first_seed: Annotated[int, typer.Option(min=0, help="Run i uses seed first_seed + i.")] = 0,
    threshold: Annotated[
        float, typer.Option(help="A run reaches it when its reward_last is at least this.")
    ] = DEMO_TARGET,
    steps: Annotated[int | None, typer.Option(min=1, help="Override trainer.total_steps of every run.")] = None,
    max_staleness: Annotated[
        int | None,
        typer.Option(min=0, help="Override stack.max_staleness (η) of every run: 0 trains synchronously."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder of the runs (seed-<k>/; with --against a/seed-<k>/ and b/seed-<k>/) and the plot;"
            " default runs/bench-learning-<time>."
        ),
    ] = None,
    model_dir: Annotated[
        Path | None, typer.Option(help="Start every seed from this model directory (stack.model_dir), e.g. an SFT's.")
    ] = None,
    timeout_s: Annotated[
        float, typer.Option(min=1, help="Longest run per seed, seconds; a slower one counts as failed.")
    ] = 1800,
    val_threshold: Annotated[
        float | None,
        typer.Option(
            help="Also report the first trainer step at which each run's held-out score reached this, and the"
            " seconds to it from the run's first validation."
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line only.")] = False,
) -> None:
    """One training config run with N seeds: spread of reward_first, reward_last, steps, wall time; runs ≥ threshold.

    With --against, two configs on the same seeds, interleaved, and compared seed by seed (McNemar's exact test).
    """
    from relayrl.extras import require

    require("matplotlib", "plots", "bench learning's figure")  # before the runs, not after them

    if model_dir is not None:
        from relayrl.models.loading import check_model_dir

        try:
            check_model_dir(model_dir)
        except FileNotFoundError as err:
            raise typer.BadParameter(str(err), param_hint="--model-dir") from None
    bases = {"a": _prepared(config, model_dir, max_staleness)}
    if against is not None:
        bases["b"] = _prepared(against, model_dir, max_staleness)
    out = (out or bases["a"].stack.runs_dir / time.strftime("bench-learning-%Y%m%d-%H%M%S")).resolve()
    chosen = [first_seed + i for i in range(seeds)]
    folders = {name: out / name if against is not None else out for name in bases}
    taken = [
        str(f.relative_to(out) / f"seed-{k}") for f in folders.values() for k in chosen if (f / f"seed-{k}").exists()
    ]
    if taken:
        # An existing run directory would be resumed from its checkpoint, not trained from scratch.
        raise typer.BadParameter(f"{out} already holds {', '.join(taken)}; choose another folder", param_hint="--out")
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    names = {"a": str(config) if config is not None else "demo", "b": str(against)}
    if against is None:
        # Looked up on the module at each call, so that a test's stand-in for the stack is the one run.
        runs = {"a": run_seeds(bases["a"], chosen, out, steps, timeout_s, learning.stack_runner)}
    else:
        runs = run_pairs(bases, chosen, out, steps, timeout_s, learning.stack_runner)
    results = {}
    for name, done in runs.items():
        title = f"bench learning: {names[name]}, seeds {chosen[0]}–{chosen[-1]}"
        plotted = plot_seeds(done, threshold, folders[name] / PLOT_NAME, title=title)
        results[name] = summarize(names[name], threshold, done, plotted.path, folders[name], val_threshold)
    if against is None:
        typer.echo(json.dumps(result_json(results["a"])) if json_output else render_table(results["a"]))
    else:
        pairing = pair(runs["a"], runs["b"], threshold)
        a, b = results["a"], results["b"]
        typer.echo(json.dumps(pairs_json(a, b, pairing)) if json_output else render_pairs(a, b, pairing))
    # With two configs, each needs a finished run for there to be anything to compare.
    if any(result.failed == len(result.runs) for result in results.values()):
        raise typer.Exit(1)


def _prepared(path: Path | None, model_dir: Path | None, max_staleness: int | None) -> StackConfig:
    """The stack config at ``path`` (None: the demo's) with the overrides every run of the bench takes."""
    from commands.stack.cli import _load_config

    base = _load_config(path)
    if model_dir is not None:
        base.stack.model_dir = model_dir.resolve()
    if max_staleness is not None:
        base.stack.max_staleness = max_staleness
    return base
