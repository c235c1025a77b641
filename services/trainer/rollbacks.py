"""What the trainer's resumes cost: the steps it trained after its checkpoint, lost with a crash
and trained again after the resume, read from the run's ``metrics.jsonl``.

A resumed trainer writes its steps again from the checkpoint on, so a row for step ``s`` at or
below a step already written marks a resume from the checkpoint before ``s``: every step from
``s`` on that was written before it is redone. ``seconds`` is the trainer's own compute for those
steps (``timing/step_s`` less ``timing/wait_s``, the wait for groups), so it is what a crash cost
the trainer; the generation the rolled-back versions made is counted apart, as groups
(``relayrl chaos`` and docs/crash-cost.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP_KEY = "trainer/global_steps"


@dataclass(frozen=True, slots=True)
class Redone:
    at_step: int  # the first step trained again
    steps: int  # steps trained before the resume that it rolled back
    seconds: float  # their compute, timing/step_s - timing/wait_s


def _compute_s(row: dict[str, Any]) -> float:
    return max(0.0, float(row.get("timing/step_s", 0.0)) - float(row.get("timing/wait_s", 0.0)))


def _rolled_back(live: dict[int, dict[str, Any]], at_step: int) -> Redone | None:
    gone = [s for s in live if s >= at_step]
    if not gone:
        return None
    seconds = sum(_compute_s(live.pop(s)) for s in gone)
    return Redone(at_step, len(gone), round(seconds, 3))


def redone_steps(rows: Iterable[dict[str, Any]], resumed_from: int | None = None) -> list[Redone]:
    """Every resume the rows show, in order; with ``resumed_from`` (the step of the checkpoint a
    trainer is resuming from now, before it writes a row), the one it is about to make as well."""
    live: dict[int, dict[str, Any]] = {}
    out = []
    for row in rows:
        if STEP_KEY not in row or "timing/step_s" not in row:
            continue  # the validation before training (step 0) is no training step
        step = int(row[STEP_KEY])
        if (redone := _rolled_back(live, step)) is not None:
            out.append(redone)
        live[step] = row
    if resumed_from is not None and (redone := _rolled_back(live, resumed_from + 1)) is not None:
        out.append(redone)
    return out


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl``; a line torn by a kill is skipped."""
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def totals(redone: list[Redone]) -> dict[str, float]:
    """The trainer's metrics of what resumes cost over the run so far."""
    return {
        "trainer/redone_steps": float(sum(r.steps for r in redone)),
        "trainer/redone_s": round(sum(r.seconds for r in redone), 3),
        "trainer/resumes_with_redone_steps": float(len(redone)),
    }
