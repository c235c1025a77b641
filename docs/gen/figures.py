"""Measured runs as data: one JSON file per benchmark under ``docs/benchmarks/``, and their rendering.

A file holds what a reader needs to trust and repeat a figure: the command, the machine (CPU
model and cores, GPU or none), the date and the bench's own JSON output, for one or more runs
(``runs``, each labelled, e.g. "fp32" and "bf16", or "η = 0" and "η = 2"). History lives in git:
a new accepted run replaces the file's figures.

Pages never type a measured figure: they hold figure blocks that :mod:`docs.gen.blocks` fills
from these files (a table per file, or the README's table of headline claims).
"""

from __future__ import annotations

import datetime
import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DOCS = Path(__file__).resolve().parents[1]
BENCHMARKS = DOCS / "benchmarks"
FIGURES = DOCS / "figures"


class Machine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu: str = Field(min_length=1, description="CPU model as the OS reports it.")
    cores: int = Field(ge=1, description="CPU cores the run had.")
    gpu: str | None = Field(description="GPU model, or null for none.")
    note: str = Field("", description="What else shared the machine, when it matters.")


class Run(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1, description="Column heading, e.g. 'fp32' or 'η = 2'.")
    statistic: str = Field(min_length=1, description="'one run', or how runs were combined: 'median of 3 runs'.")
    command: str = Field("", description="The command of this run, where it differs from the file's.")
    output: dict[str, Any] = Field(description="The bench's JSON output, in its own keys.")


class Headline(BaseModel):
    """One claim of the README's table and the figure that backs it."""

    model_config = ConfigDict(extra="forbid")

    order: int = Field(description="Row order in the README's table.")
    claim: str = Field(min_length=1, description="What RelayRL does for the user, in words.")
    figure: str = Field(min_length=1, description="A format string over the run's flattened output keys.")
    run: str = Field("", description="Label of the run it reads; empty: the first.")


class Plot(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["curve", "bars"]
    keys: list[str] = Field(min_length=1, description="curve: output keys of lists to draw; bars: scalar keys.")
    x: str = Field("", description="curve: the output key of the x values.")
    xlabel: str = ""
    ylabel: str = ""


class FiguresFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1)
    command: str = Field(min_length=1, description="The command a user runs to measure it again.")
    machine: Machine
    date: datetime.date
    source: str = Field(min_length=1, description="Where the figures come from (a run's files, a README).")
    page: str = Field(min_length=1, description="The docs page, relative to docs/, that explains the figures.")
    runs: list[Run] = Field(min_length=1)
    headline: Headline | None = None
    plot: Plot | None = None

    def run(self, label: str = "") -> Run:
        if not label:
            return self.runs[0]
        for run in self.runs:
            if run.label == label:
                return run
        raise KeyError(f"no run labelled {label!r}")

    def headline_text(self) -> str:
        assert self.headline is not None
        return fill_figures(self.headline.figure, flatten(self.run(self.headline.run).output))


def load(name: str) -> FiguresFile:
    path = BENCHMARKS / f"{name}.json"
    if not path.is_file():
        raise KeyError(f"no figures file docs/benchmarks/{name}.json")
    try:
        return FiguresFile.model_validate_json(path.read_text())
    except ValidationError as exc:
        raise ValueError(f"docs/benchmarks/{name}.json: {exc}") from None


def names() -> list[str]:
    return sorted(p.stem for p in BENCHMARKS.glob("*.json"))


def flatten(output: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Scalar figures under dotted keys (``trainer_idle_ratio.async``); lists (curves) are left out."""
    flat: dict[str, Any] = {}
    for key, value in output.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        elif not isinstance(value, list):
            flat[name] = value
    return flat


PLACEHOLDER = re.compile(r"\{(?P<key>[\w.]+)(?P<percent>:%)?\}")


def fill_figures(template: str, flat: dict[str, Any]) -> str:
    """``{key}`` becomes that figure of the output, ``{key:%}`` a share shown as a percentage."""

    def one(match: re.Match[str]) -> str:
        key = match["key"]
        if key not in flat:
            raise KeyError(f"no figure {key!r} in the run's output")
        value = flat[key]
        if match["percent"]:
            return f"{round(100 * float(value), 1):g} %"
        return show(value)

    return PLACEHOLDER.sub(one, template)


def show(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    # A whole float from 100 up is a count or a duration (900.0 s of faults): shown as a whole
    # number. Below, it keeps its decimal, as a ratio or a time measured at 1.0 should.
    if isinstance(value, float) and math.isfinite(value) and value == int(value) and abs(value) >= 100:
        return f"{int(value):,}"
    if isinstance(value, int):
        return f"{value:,}"
    # A rate in the thousands reads with its separators too (48,747.48 tokens/s), its decimals kept.
    if isinstance(value, float) and math.isfinite(value) and abs(value) >= 1000:
        return f"{value:,}"
    return str(value)


def table(figures: FiguresFile) -> str:
    """Every scalar of every run: one row per output key, one column per run."""
    columns = [flatten(run.output) for run in figures.runs]
    keys: list[str] = []
    for column in columns:
        keys += [key for key in column if key not in keys]
    head = "| figure | " + " | ".join(run.label for run in figures.runs) + " |"
    rule = "| --- |" + " ---: |" * len(figures.runs)
    rows = [f"| `{key}` | " + " | ".join(show(column.get(key)) for column in columns) + " |" for key in keys]
    return "\n".join([head, rule, *rows])


def provenance(figures: FiguresFile, data_link: str) -> str:
    machine = figures.machine
    gpu = machine.gpu or "no GPU"
    by_command: dict[str, list[str]] = {}
    for run in figures.runs:
        by_command.setdefault(run.command or figures.command, []).append(run.label)
    if len(by_command) == 1:
        commands = f"`{figures.command}`"
    else:
        commands = "; ".join(f"`{command}` ({', '.join(labels)})" for command, labels in by_command.items())
    if len({run.statistic for run in figures.runs}) == 1:
        statistics = figures.runs[0].statistic
    else:
        statistics = "; ".join(f"{run.label}: {run.statistic}" for run in figures.runs)
    lines = [
        commands,
        f"{machine.cpu}, {machine.cores} cores, {gpu}; {figures.date.isoformat()}; {statistics}."
        + (f" {machine.note}" if machine.note else ""),
        f"Source: {figures.source} ([data]({data_link}))",
    ]
    return "  \n".join(lines)
