"""The run report: ``report.json`` and ``reward.png`` from a run's ``metrics.jsonl``.

``reward_first`` and ``reward_last`` are means over the first and last ``window`` steps, so a
single lucky batch does not decide whether training worked.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

# The trainer's held-out scores (verl's key), one per data source, on the steps it validated.
VALIDATION_PREFIX = "val/test_score/"
# What crashes cost the run, as the trainer's last row says (services.trainer.rollbacks; docs/crash-cost.md).
CRASH_COST_KEYS = ("trainer/redone_steps", "trainer/redone_s", "trainer/resumes_with_redone_steps")
# The trainer's shares of each batch's groups whose samples all scored alike, and of those whose samples all
# scored 0 or less (services.trainer.filtering).
NO_SIGNAL_KEY, ALL_FAILED_KEY = "batch/no_signal_frac", "batch/all_failed_frac"
# A run ends stalled when at least STALLED_NO_SIGNAL of its last window's groups taught GRPO nothing and at
# least STALLED_FAILED failed whole: a policy that learned fails few groups whole. Set from the last steps
# (the 8-16 their trajectory logs kept) of 202 copy_bits runs of earlier sweeps: none of the 164 that ended
# at 0.9 or more failed more than 0.05 of its groups whole; of the 22 that ended between 0.4 and 0.62 (one
# answer to every prompt, mostly) 19 are caught, and all 4 that ended near 0 (run away to uniform).
STALLED_NO_SIGNAL, STALLED_FAILED = 0.7, 0.25


@dataclass(frozen=True, slots=True)
class RunReport:
    run_id: str
    steps: int
    wall_s: float
    reward_key: str
    window: int
    reward_first: float
    reward_last: float
    reward_rise: float
    max_staleness: int
    max_sample_age: float
    samples_per_s: float
    # The first and last held-out score of each validated data source (val/test_score/<data_source>);
    # the first is the starting policy's when the trainer validated before training.
    val_first: dict[str, float]
    val_last: dict[str, float]
    extra: dict[str, Any]
    # Steps trained after a checkpoint and redone after a resume, their seconds, and the resumes.
    crash_cost: dict[str, float] = field(default_factory=dict)
    # A resumed run's span: the checkpoint step it resumed from (0: from the start) and the steps
    # trained since; wall_s and samples_per_s cover that span only.
    resumed_from_step: int = 0
    span_steps: int = 0
    # Means over the last window of the shares of groups without signal and failed whole (NO_SIGNAL_KEY,
    # ALL_FAILED_KEY); None when the trainer did not record them.
    no_signal_last: float | None = None
    all_failed_last: float | None = None

    @property
    def stalled(self) -> bool:
        """The run ended learning nothing: most of its last groups alike within themselves, many failed whole."""
        no_signal, failed = self.no_signal_last, self.all_failed_last
        return (
            no_signal is not None and failed is not None and no_signal >= STALLED_NO_SIGNAL and failed >= STALLED_FAILED
        )

    def stall_note(self) -> str | None:
        """The line a stalled run prints under its reward, else None."""
        if not self.stalled:
            return None
        return (
            f"stalled: over the last {self.window} steps {self.no_signal_last:.2f} of the groups scored alike within"
            f" themselves and {self.all_failed_last:.2f} failed whole, so GRPO learned nothing from them and the"
            " policy stopped improving (batch/no_signal_frac in metrics.jsonl; docs/getting-started.md, 'When a"
            " run stalls')"
        )


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of ``metrics.jsonl``; a torn last line (the trainer was killed mid-write) is skipped."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def training_rows(rows: list[dict[str, Any]], reward_key: str) -> list[dict[str, Any]]:
    return [r for r in rows if reward_key in r and "trainer/global_steps" in r]


def elapsed_s(row: dict[str, Any], started_at: float) -> float:
    """Seconds from the start of the run to when the trainer wrote ``row`` (its unix ``time``)."""
    return float(row["time"]) - started_at


def build_report(
    run_id: str,
    rows: list[dict[str, Any]],
    reward_key: str,
    window: int,
    max_staleness: int,
    started_at: float,
    resumed_from_step: int = 0,
    **extra: Any,
) -> RunReport:
    steps = training_rows(rows, reward_key)
    if not steps:
        raise ValueError(f"no training steps with {reward_key!r} in the metrics")
    window = max(1, min(window, len(steps) // 2 or 1))
    rewards = [float(r[reward_key]) for r in steps]
    first, last = fmean(rewards[:window]), fmean(rewards[-window:])
    wall = elapsed_s(steps[-1], started_at)
    # The samples of the resumed-from step (its last line before this span) are history.
    before = [r for r in steps if int(r["trainer/global_steps"]) == resumed_from_step and float(r["time"]) < started_at]
    baseline = float(before[-1].get("trainer/processed_samples", 0.0)) if before else 0.0
    samples = float(steps[-1].get("trainer/processed_samples", 0.0)) - baseline
    validation = validation_series(rows, started_at)
    ages = [float(r.get("staleness/max_sample_age", 0.0)) for r in steps]
    tail = steps[-window:]
    return RunReport(
        run_id=run_id,
        steps=int(steps[-1]["trainer/global_steps"]),
        wall_s=wall,
        reward_key=reward_key,
        window=window,
        reward_first=first,
        reward_last=last,
        reward_rise=last - first,
        max_staleness=max_staleness,
        max_sample_age=max(ages),
        samples_per_s=samples / wall if wall > 0 else 0.0,
        val_first={key: points[0][2] for key, points in validation.items()},
        val_last={key: points[-1][2] for key, points in validation.items()},
        extra=extra,
        crash_cost={key.removeprefix("trainer/"): float(steps[-1].get(key, 0.0)) for key in CRASH_COST_KEYS},
        resumed_from_step=resumed_from_step,
        span_steps=int(steps[-1]["trainer/global_steps"]) - resumed_from_step,
        no_signal_last=_tail_mean(tail, NO_SIGNAL_KEY),
        all_failed_last=_tail_mean(tail, ALL_FAILED_KEY),
    )


def _tail_mean(tail: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in tail if key in r]
    return fmean(values) if values else None


def write_report(report: RunReport, run_dir: Path) -> Path:
    path = run_dir / "report.json"
    path.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return path


def validation_series(rows: list[dict[str, Any]], started_at: float) -> dict[str, list[tuple[int, float, float]]]:
    """Held-out scores (``val/test_score/<data_source>``) as (step, seconds since the start, score)
    per key, from every trainer row (step 0 is the validation before training)."""
    series: dict[str, list[tuple[int, float, float]]] = {}
    for row in rows:
        if "trainer/global_steps" not in row:
            continue
        for key, value in row.items():
            if key.startswith(VALIDATION_PREFIX):
                point = (int(row["trainer/global_steps"]), elapsed_s(row, started_at), float(value))
                series.setdefault(key, []).append(point)
    return series


def plot_reward(rows: list[dict[str, Any]], reward_key: str, started_at: float, out: Path, title: str = "") -> Path:
    """Mean reward against wall-clock time and against trainer step, side by side, with the
    held-out scores of the validation steps beside it."""
    from relayrl.extras import require

    matplotlib = require("matplotlib", "plots", "reward.png")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = training_rows(rows, reward_key)
    xs_step = [r["trainer/global_steps"] for r in steps]
    xs_time = [elapsed_s(r, started_at) for r in steps]
    ys = [r[reward_key] for r in steps]
    validation = validation_series(rows, started_at)
    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for axis, xs, label, at in ((by_time, xs_time, "wall-clock time (s)", 1), (by_step, xs_step, "trainer step", 0)):
        axis.plot(xs, ys, color="tab:blue", linewidth=1.2, label="training reward")
        for n, (key, points) in enumerate(validation.items(), start=1):
            xy = [p[at] for p in points], [p[2] for p in points]
            axis.plot(*xy, color=f"C{n}", marker="o", linewidth=1.0, label=key)
        axis.set_xlabel(label)
        axis.grid(alpha=0.3)
    by_time.set_ylabel(f"mean reward ({reward_key})")
    if validation:
        by_step.legend(loc="lower right", fontsize="small")
    fig.suptitle(title or "RelayRL: mean reward")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
