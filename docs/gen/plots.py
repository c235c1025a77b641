"""Plots of measured runs, drawn from their figures files into ``docs/figures/bench-<name>.png``.

A file's ``plot`` says what to draw: ``curve`` draws lists of its output against an x list (reward
by step), ``bars`` draws scalar figures side by side, one group per run (the stages of a weight
update, the phases of the end-to-end bench).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from docs.gen import figures as fig


def _value(output: dict, key: str) -> object:
    value: object = output
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _label(key: str) -> str:
    """A bar's name: the figure without its unit (the axis names the unit)."""
    name = key.split(".")[0]
    for unit in ("_samples_per_s", "_s"):
        name = name.removesuffix(unit)
    return name.replace("_", " ")


def draw(name: str, figures: fig.FiguresFile) -> Path:
    assert figures.plot is not None
    plot = figures.plot
    out = fig.FIGURES / f"bench-{name}.png"
    figure, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    if plot.kind == "curve":
        for run in figures.runs:
            x = _value(run.output, plot.x)
            for key in plot.keys:
                y = _value(run.output, key)
                if isinstance(x, list) and isinstance(y, list):
                    label = key if len(figures.runs) == 1 else f"{run.label}: {key}"
                    ax.plot(x, y, label=label)
    else:
        width = 0.8 / len(figures.runs)
        for i, run in enumerate(figures.runs):
            values = [_value(run.output, key) for key in plot.keys]
            heights = [float(v) if isinstance(v, int | float) else 0.0 for v in values]
            ax.bar([k + i * width for k in range(len(plot.keys))], heights, width, label=run.label)
        ax.set_xticks([k + width * (len(figures.runs) - 1) / 2 for k in range(len(plot.keys))])
        ax.set_xticklabels([_label(key) for key in plot.keys], rotation=20, ha="right")
    ax.set_title(figures.title, fontsize=10)
    ax.set_xlabel(plot.xlabel)
    ax.set_ylabel(plot.ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, metadata={"Software": None})
    plt.close(figure)
    return out
