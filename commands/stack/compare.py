"""``relayrl bench compare``: groups of seeded runs (``bench learning`` folders) side by side.

The question it answers is the one asynchrony raises: does training with η = 2 learn as well per
step as training with η = 0, and how much sooner in wall time? Each group is a folder of
``seed-<k>/metrics.jsonl`` runs; for every group the bench takes the mean and the min–max spread
over its seeds of the training reward and of each held-out score, at every step, and prints one
JSON line with them. ``within_spread`` says, for each later group and held-out score, whether its
mean lies inside the first group's min–max at every validation step both have. One plot shows
reward and held-out score against trainer step and against wall time (seconds since each run's
first logged row), a mean line and a shaded spread per group.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from commands.stack.learning import Curves, read_curves
from commands.stack.progress import REWARD_KEY

PLOT_NAME = "compare.png"
# Points of the common wall-time grid each group's runs are interpolated onto.
TIME_GRID = 200


@dataclass(frozen=True, slots=True)
class Band:
    """One figure over a group's seeds at each x: the mean and the min–max spread."""

    x: tuple[float, ...]
    mean: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    folder: Path
    seeds: tuple[str, ...]
    # Per figure (the reward key or a val/test_score/<data_source> key): its band by step and by seconds.
    by_step: dict[str, Band]
    by_time: dict[str, Band]


def band_by_step(curves: list[tuple[tuple[int, float], ...]]) -> Band:
    """At each step every run recorded: mean, min and max over the runs."""
    by_step = [dict(c) for c in curves]
    steps = sorted(set.intersection(*(set(points) for points in by_step))) if by_step else []
    values = [[points[step] for points in by_step] for step in steps]
    return Band(
        tuple(float(s) for s in steps),
        tuple(statistics.fmean(v) for v in values),
        tuple(min(v) for v in values),
        tuple(max(v) for v in values),
    )


def band_by_time(curves: list[tuple[tuple[float, float], ...]]) -> Band:
    """Each run's (seconds, value) points interpolated onto one grid up to the shortest run's end."""
    import numpy as np

    curves = [c for c in curves if c]
    if not curves:
        return Band((), (), (), ())
    end = min(c[-1][0] for c in curves)
    start = max(c[0][0] for c in curves)
    grid = np.linspace(start, end, TIME_GRID) if end > start else np.array([end])
    runs = np.stack([np.interp(grid, [t for t, _ in c], [v for _, v in c]) for c in curves])
    return Band(
        tuple(grid.tolist()),
        tuple(runs.mean(axis=0).tolist()),
        tuple(runs.min(axis=0).tolist()),
        tuple(runs.max(axis=0).tolist()),
    )


def read_group(name: str, folder: Path) -> Group:
    runs = sorted(p for p in folder.glob("seed-*") if (p / "metrics.jsonl").is_file())
    if not runs:
        raise typer.BadParameter(f"{folder} holds no seed-*/metrics.jsonl", param_hint="--runs")
    curves: list[Curves] = [read_curves(run) for run in runs]
    keys = sorted(set.intersection(*(set(c.val) for c in curves)))
    by_step = {REWARD_KEY: band_by_step([c.reward for c in curves])}
    by_step.update({key: band_by_step([c.val[key] for c in curves]) for key in keys})
    by_time = {key: band_by_time([c.by_time.get(key, ()) for c in curves]) for key in (REWARD_KEY, *keys)}
    return Group(name, folder, tuple(run.name for run in runs), by_step, by_time)


def within_spread(reference: Band, other: Band) -> bool | None:
    """Whether ``other``'s mean lies in ``reference``'s min–max at every step both have; None if none."""
    ref = dict(zip(reference.x, zip(reference.low, reference.high, strict=True), strict=True))
    shared = [(x, m) for x, m in zip(other.x, other.mean, strict=True) if x in ref]
    if not shared:
        return None
    return all(ref[x][0] <= m <= ref[x][1] for x, m in shared)


def plot(groups: list[Group], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [REWARD_KEY, *[k for k in groups[0].by_step if k != REWARD_KEY]]
    fig, axes = plt.subplots(len(keys), 2, figsize=(11, 3.6 * len(keys)), squeeze=False)
    for row, key in enumerate(keys):
        for col, (attr, xlabel) in enumerate((("by_step", "trainer step"), ("by_time", "wall-clock time (s)"))):
            axis = axes[row][col]
            for group in groups:
                band = getattr(group, attr).get(key)
                if band is None or not band.x:
                    continue
                marker = "o" if key != REWARD_KEY and attr == "by_step" else None
                label = f"{group.name} ({len(group.seeds)} seeds)"
                (line,) = axis.plot(band.x, band.mean, linewidth=1.2, marker=marker, markersize=3, label=label)
                axis.fill_between(band.x, band.low, band.high, color=line.get_color(), alpha=0.2, linewidth=0)
            axis.set_xlabel(xlabel)
            axis.set_ylabel(key)
            axis.grid(alpha=0.3)
            axis.legend(fontsize="small")
    fig.suptitle("mean over seeds, shaded: min–max")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _band_json(band: Band) -> dict[str, list[float]]:
    return {name: [round(v, 3) for v in getattr(band, name)] for name in ("x", "mean", "low", "high")}


def result_json(groups: list[Group], plotted: Path) -> dict[str, Any]:
    reference, *others = groups
    return {
        "benchmark": "compare",
        "groups": {
            g.name: {
                "folder": str(g.folder),
                "seeds": list(g.seeds),
                "by_step": {key: _band_json(band) for key, band in g.by_step.items()},
                "final": {key: round(band.mean[-1], 3) for key, band in g.by_step.items() if band.mean},
            }
            for g in groups
        },
        "within_spread": {
            g.name: {
                key: within_spread(reference.by_step[key], band)
                for key, band in g.by_step.items()
                if key != REWARD_KEY and key in reference.by_step
            }
            for g in others
        },
        "plot": str(plotted),
    }


def parse_group(spec: str) -> tuple[str, Path]:
    name, sep, folder = spec.partition("=")
    if not sep or not name or not folder:
        raise typer.BadParameter(f"{spec!r} is not NAME=FOLDER", param_hint="--runs")
    return name, Path(folder)


def bench(
    runs: Annotated[
        list[str],
        typer.Option(
            help="NAME=FOLDER of a `bench learning` run (its seed-*/ runs); twice or more; the first is"
            " the reference of within_spread."
        ),
    ],
    out: Annotated[Path | None, typer.Option(help=f"The plot; default FOLDER/{PLOT_NAME} of the first group.")] = None,
) -> None:
    """Seeded run groups side by side: reward and held-out score by step and by wall time, mean ± spread."""
    from relayrl.extras import require

    require("matplotlib", "plots", "bench compare's figure")
    specs = [parse_group(spec) for spec in runs]
    if len(specs) < 2:
        raise typer.BadParameter("give at least two groups to compare", param_hint="--runs")
    groups = [read_group(name, folder) for name, folder in specs]
    plotted = plot(groups, out or specs[0][1] / PLOT_NAME)
    typer.echo(json.dumps(result_json(groups, plotted)))
