"""``relayrl bench learning``: one training config run with N seeds, and how its reward is spread.

A single run's reward cannot tell a bug from bad luck: runs of one config differ from seed to seed.
This bench runs the same stack config once per seed, one run after another (a demo run already
keeps both cores of a CI-class machine busy), and reports the distribution of ``reward_first``,
``reward_last``, steps and wall time over the runs, how many reached ``--threshold``, and one plot
with every seed's reward curve. With ``--val-threshold`` it also reports, per held-out score, the
first trainer step at which each run's score reached it: the figure that says whether a recipe
gets to the same accuracy in fewer steps.

Seed ``k`` sets every source of randomness of a run: the trainer's ``seed`` (dataset rows, their
shuffled order, torch), the built-in model's initialisation (``stack.tiny_seed``) and the
engine's sampling generator (``engine.seed``; replica i samples with ``seed + i``). The rollout
service draws nothing at random. A config with its own ``stack.model_dir`` starts every seed from
that model's weights.

With ``--against`` a second config trains on the same seeds, interleaved with the first, and the two
are compared seed by seed (:mod:`commands.stack.learning_pairs`).
"""

from __future__ import annotations

import signal
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from commands.stack.config import StackConfig
from commands.stack.progress import REWARD_KEY
from commands.stack.report import RunReport, elapsed_s, read_metrics, training_rows, validation_series

if TYPE_CHECKING:
    from commands.stack.run import RunOutcome

# The demo's target: `make demo` should end with a mean reward of at least this.
DEMO_TARGET = 0.9
# run_stack's exit code when Ctrl-C (or SIGTERM) stopped the run: the user wants the bench to stop.
INTERRUPTED = 130
PLOT_NAME = "reward-by-seed.png"

Runner = Callable[[StackConfig], "RunOutcome"]


@dataclass(frozen=True, slots=True)
class SeedRun:
    """One seed's run: its report when it finished, else why it failed."""

    seed: int
    run_dir: Path
    report: RunReport | None
    # (trainer step, mean reward) of every step the run recorded, finished or not.
    curve: tuple[tuple[int, float], ...]
    error: str = ""
    # (trainer step, held-out score) per val/test_score/<data_source> key; step 0 is before training.
    val_curve: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    # The same scores against seconds since the run's first logged row (the validation before training).
    val_by_time: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    def reached(self, threshold: float) -> bool:
        return self.report is not None and self.report.reward_last >= threshold

    @property
    def stalled(self) -> bool:
        """The run ended learning nothing (RunReport.stalled)."""
        return self.report is not None and self.report.stalled

    def val_reached_at(self, key: str, threshold: float) -> int | None:
        """The first step whose held-out ``key`` score is at least ``threshold``; None if none was."""
        return next((step for step, score in self.val_curve.get(key, ()) if score >= threshold), None)

    def val_reached_after(self, key: str, threshold: float) -> float | None:
        """Seconds from the run's first logged row to its first held-out ``key`` score at least
        ``threshold``; None if none was."""
        return next((seconds for seconds, score in self.val_by_time.get(key, ()) if score >= threshold), None)


@dataclass(frozen=True, slots=True)
class Distribution:
    """One figure over the runs that finished, in seed order."""

    min: float
    median: float
    mean: float
    max: float
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class ShareInterval:
    """A confidence interval for the share of runs that reached the threshold."""

    share: float
    low: float
    high: float
    confidence: float


def wilson_interval(hits: int, n: int, confidence: float = 0.95) -> ShareInterval:
    """Wilson's score interval for ``hits`` of ``n``. At ten seeds one sweep's count says little on its
    own (8 of 10 is 0.49-0.94); the interval puts that next to the count, so two sweeps that differ by a
    run or two are not read as a difference between configs. Wilson's rather than the normal
    approximation's: that one gives 10 of 10 a width of zero and can leave [0, 1]."""
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    share = hits / n
    scale = 1 + z * z / n
    centre = (share + z * z / (2 * n)) / scale
    half = z * ((share * (1 - share) / n + z * z / (4 * n * n)) ** 0.5) / scale
    return ShareInterval(share, max(0.0, centre - half), min(1.0, centre + half), confidence)


@dataclass(frozen=True, slots=True)
class LearningResult:
    config: str
    threshold: float
    runs: tuple[SeedRun, ...]
    reward_first: Distribution | None
    reward_last: Distribution | None
    steps: Distribution | None
    wall_s: Distribution | None
    # Per held-out key (val/test_score/<data_source>), over the finished runs that validated.
    val_first: dict[str, Distribution]
    val_last: dict[str, Distribution]
    # With a val_threshold: per held-out key, the first step each finished run reached it and the
    # seconds it took, over the runs that did, and how many did.
    val_threshold: float | None
    val_steps_to_threshold: dict[str, Distribution]
    val_reached: dict[str, int]
    val_seconds_to_threshold: dict[str, Distribution]
    reached: int
    failed: int
    plot: Path
    out: Path

    @property
    def stalled(self) -> int:
        return sum(run.stalled for run in self.runs)

    @property
    def reached_interval(self) -> ShareInterval:
        """Over every run, failed ones counted as not reaching the threshold."""
        return wilson_interval(self.reached, len(self.runs))


def distribution(values: list[float]) -> Distribution | None:
    """None when no run finished: a spread of nothing would read as a measurement."""
    if not values:
        return None
    return Distribution(min(values), statistics.median(values), statistics.fmean(values), max(values), tuple(values))


def held_out(reports: list[RunReport], which: str) -> dict[str, Distribution]:
    """The spread of each held-out score (``val_first`` or ``val_last``) over the reports that have it."""
    keys = sorted({key for r in reports for key in getattr(r, which)})
    spreads = {key: distribution([getattr(r, which)[key] for r in reports if key in getattr(r, which)]) for key in keys}
    return {key: d for key, d in spreads.items() if d is not None}


def steps_to_threshold(runs: list[SeedRun], val_threshold: float | None) -> dict[str, list[int | None]]:
    """Per held-out key, each run's first step at ``val_threshold`` or above (None: never); {} without one."""
    if val_threshold is None:
        return {}
    keys = sorted({key for run in runs for key in run.val_curve})
    return {key: [run.val_reached_at(key, val_threshold) for run in runs] for key in keys}


def summarize(
    config: str, threshold: float, runs: list[SeedRun], plot: Path, out: Path, val_threshold: float | None = None
) -> LearningResult:
    reports = [run.report for run in runs if run.report is not None]
    finished = [run for run in runs if run.report is not None]
    at = steps_to_threshold(finished, val_threshold)
    to_threshold = {key: distribution([float(s) for s in steps if s is not None]) for key, steps in at.items()}
    after = {key: [run.val_reached_after(key, val_threshold) for run in finished] for key in at} if at else {}
    seconds_to = {key: distribution([s for s in seconds if s is not None]) for key, seconds in after.items()}
    return LearningResult(
        config=config,
        threshold=threshold,
        runs=tuple(runs),
        reward_first=distribution([r.reward_first for r in reports]),
        reward_last=distribution([r.reward_last for r in reports]),
        steps=distribution([float(r.steps) for r in reports]),
        wall_s=distribution([r.wall_s for r in reports]),
        val_first=held_out(reports, "val_first"),
        val_last=held_out(reports, "val_last"),
        val_threshold=val_threshold,
        val_steps_to_threshold={key: d for key, d in to_threshold.items() if d is not None},
        val_reached={key: sum(s is not None for s in steps) for key, steps in at.items()},
        val_seconds_to_threshold={key: d for key, d in seconds_to.items() if d is not None},
        reached=sum(run.reached(threshold) for run in runs),
        failed=len(runs) - len(reports),
        plot=plot,
        out=out,
    )


def seeded_config(base: StackConfig, seed: int, out: Path, steps: int | None) -> StackConfig:
    """``base`` with every seed set to ``seed``, running in ``out/seed-<seed>``; ``steps`` replaces total_steps."""
    config = base.model_copy(deep=True)
    config.stack.runs_dir = out
    config.stack.run_id = f"seed-{seed}"
    config.stack.tiny_seed = seed
    config.trainer["seed"] = seed
    config.engine["seed"] = seed
    if steps is not None:
        config.trainer["total_steps"] = steps
    return config


@dataclass(frozen=True, slots=True)
class Curves:
    reward: tuple[tuple[int, float], ...]
    val: dict[str, tuple[tuple[int, float], ...]]
    # The reward (REWARD_KEY) and each held-out score against seconds since the run's first logged row.
    by_time: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    @property
    def val_by_time(self) -> dict[str, tuple[tuple[float, float], ...]]:
        return {key: points for key, points in self.by_time.items() if key in self.val}


def read_curves(run_dir: Path) -> Curves:
    """Mean reward per trainer step and each held-out score per validation step, by step and by
    seconds, from one read of metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    rows = read_metrics(path) if path.exists() else []
    if not rows:
        return Curves((), {})
    started_at = float(rows[0]["time"])
    trained = training_rows(rows, REWARD_KEY)
    reward = tuple((int(r["trainer/global_steps"]), float(r[REWARD_KEY])) for r in trained)
    series = validation_series(rows, started_at)
    val = {key: tuple((step, score) for step, _, score in points) for key, points in series.items()}
    by_time = {REWARD_KEY: tuple((elapsed_s(r, started_at), float(r[REWARD_KEY])) for r in trained)}
    by_time.update({key: tuple((seconds, score) for _, seconds, score in points) for key, points in series.items()})
    return Curves(reward, val, by_time)


class RunTimedOut(BaseException):
    """A run past its ``--timeout-s``. Not an ``Exception``: raised from a signal handler wherever the
    main thread is, it must pass the handlers there. A TimeoutError (an OSError) raised inside an
    HTTP call became httpx's ReadTimeout, which a poll of /metrics catches, and the run went on."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raises :class:`RunTimedOut` in the main thread after ``seconds``; the stack's supervisor then
    stops every component."""

    def expire(_signum: int, _frame: object) -> None:
        raise RunTimedOut(f"the run did not finish within {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_seed(config: StackConfig, seed: int, runner: Runner, timeout_s: float) -> SeedRun:
    """One run; any failure is recorded with its reason so the next seed still runs."""
    run_dir = (config.stack.runs_dir / config.stack.run_id).resolve()
    try:
        with deadline(timeout_s):
            outcome = runner(config)
    except (Exception, RunTimedOut) as err:  # a failed seed is a result of the bench, not the end of it
        curves = read_curves(run_dir)
        return SeedRun(
            seed, run_dir, None, curves.reward, f"{type(err).__name__}: {err}", curves.val, curves.val_by_time
        )
    if outcome.exit_code == INTERRUPTED:
        raise KeyboardInterrupt
    if outcome.report is None:
        reason = outcome.error or f"trainer exited with code {outcome.exit_code}; logs in {run_dir / 'logs'}"
        curves = read_curves(run_dir)
        return SeedRun(seed, run_dir, None, curves.reward, reason, curves.val, curves.val_by_time)
    curves = read_curves(outcome.run_dir)
    return SeedRun(
        seed, outcome.run_dir, outcome.report, curves.reward, val_curve=curves.val, val_by_time=curves.val_by_time
    )


@dataclass(frozen=True, slots=True)
class Plotted:
    path: Path
    # The seeds drawn, one line each, in the order drawn.
    seeds: tuple[int, ...]


def plot_seeds(runs: list[SeedRun], threshold: float, out: Path, title: str) -> Plotted:
    """Every seed's mean reward against trainer step on one axis; failed runs dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(8, 4.5))
    drawn = []
    for run in runs:
        if not run.curve:
            continue
        steps, rewards = zip(*run.curve, strict=True)
        label = f"seed {run.seed}" + ("" if run.report is not None else " (failed)")
        axis.plot(
            steps, rewards, linewidth=1.0, alpha=0.8, label=label, linestyle="-" if run.report is not None else "--"
        )
        drawn.append(run.seed)
    axis.axhline(threshold, color="black", linewidth=0.8, linestyle=":", label=f"threshold {threshold:g}")
    axis.set_xlabel("trainer step")
    axis.set_ylabel(f"mean reward ({REWARD_KEY})")
    axis.grid(alpha=0.3)
    axis.legend(fontsize="small", ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Plotted(out, tuple(drawn))


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def rounded_json(d: Distribution | None, digits: int) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "min": round(d.min, digits),
        "median": round(d.median, digits),
        "mean": round(d.mean, digits),
        "max": round(d.max, digits),
        "values": [round(v, digits) for v in d.values],
    }


def result_json(result: LearningResult) -> dict[str, Any]:
    interval = result.reached_interval
    return {
        "benchmark": "learning",
        "config": result.config,
        "seeds": [run.seed for run in result.runs],
        "threshold": result.threshold,
        "reached": result.reached,
        "reached_interval": {
            "share": round(interval.share, 3),
            "low": round(interval.low, 3),
            "high": round(interval.high, 3),
            "confidence": interval.confidence,
            "method": "wilson",
        },
        "failed": result.failed,
        "stalled": result.stalled,
        "reward_first": rounded_json(result.reward_first, 3),
        "reward_last": rounded_json(result.reward_last, 3),
        "steps": rounded_json(result.steps, 1),
        "wall_s": rounded_json(result.wall_s, 1),
        "val_first": {key: rounded_json(d, 3) for key, d in result.val_first.items()},
        "val_last": {key: rounded_json(d, 3) for key, d in result.val_last.items()},
        "val_threshold": result.val_threshold,
        "val_steps_to_threshold": {key: rounded_json(d, 1) for key, d in result.val_steps_to_threshold.items()},
        "val_reached": result.val_reached,
        "val_seconds_to_threshold": {key: rounded_json(d, 1) for key, d in result.val_seconds_to_threshold.items()},
        "runs": [
            {
                "seed": run.seed,
                "run_dir": str(run.run_dir),
                "reward_first": round(run.report.reward_first, 3) if run.report else None,
                "reward_last": round(run.report.reward_last, 3) if run.report else None,
                "steps": run.report.steps if run.report else None,
                "wall_s": round(run.report.wall_s, 1) if run.report else None,
                "val_first": {k: round(v, 3) for k, v in run.report.val_first.items()} if run.report else None,
                "val_last": {k: round(v, 3) for k, v in run.report.val_last.items()} if run.report else None,
                "val_curve": {k: [[step, round(score, 3)] for step, score in v] for k, v in run.val_curve.items()},
                "val_steps_to_threshold": {k: run.val_reached_at(k, result.val_threshold) for k in result.val_reached}
                if result.val_threshold is not None and run.report
                else None,
                "val_seconds_to_threshold": {
                    k: _round(run.val_reached_after(k, result.val_threshold), 1) for k in result.val_reached
                }
                if result.val_threshold is not None and run.report
                else None,
                "reached": run.reached(result.threshold),
                "stalled": run.stalled if run.report else None,
                "error": run.error or None,
            }
            for run in result.runs
        ],
        "plot": str(result.plot),
        "out": str(result.out),
    }


def render_table(result: LearningResult) -> str:
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    seeds = [run.seed for run in result.runs]
    table = Table(title=f"bench learning: {result.config}, seeds {seeds[0]} to {seeds[-1]}")
    for column in ("seed", "reward_first", "reward_last", "steps", "wall_s", "reached"):
        table.add_column(column, justify="right")
    for run in result.runs:
        r = run.report
        if r is None:
            table.add_row(str(run.seed), "-", "-", "-", "-", f"failed: {run.error.splitlines()[0]}")
        else:
            reached = "yes" if run.reached(result.threshold) else "no (stalled)" if run.stalled else "no"
            table.add_row(
                str(run.seed), f"{r.reward_first:.3f}", f"{r.reward_last:.3f}", str(r.steps), f"{r.wall_s:.0f}", reached
            )
    # Each figure with the digits its per-run cells show (a median of steps may fall between two runs).
    figures = ((result.reward_first, 3), (result.reward_last, 3), (result.steps, 1), (result.wall_s, 0))
    if result.reward_last is not None:
        table.add_section()
        for stat in ("min", "median", "mean", "max"):
            cells = [f"{getattr(d, stat):.{digits}f}" if d is not None else "-" for d, digits in figures]
            table.add_row(stat, *cells, "")
    out = StringIO()
    console = Console(file=out, width=120)
    console.print(table)
    interval = result.reached_interval
    reached = (
        f"{result.reached} of {len(result.runs)} runs ({result.failed} failed, {result.stalled} stalled);"
        f" share {interval.share:.2f},"
        f" {interval.confidence:.0%} interval {interval.low:.2f}-{interval.high:.2f} (Wilson)"
    )
    console.print(f"reached reward_last ≥ {result.threshold:g}: {reached}")
    for key, count in result.val_reached.items():
        finished = len(result.runs) - result.failed
        spread = result.val_steps_to_threshold.get(key)
        steps = f"; steps to it: median {spread.median:g}, values {list(spread.values)}" if spread else ""
        seconds = result.val_seconds_to_threshold.get(key)
        steps += f"; seconds to it: median {seconds.median:.1f}" if seconds else ""
        console.print(f"{key} ≥ {result.val_threshold:g}: {count} of {finished} finished runs{steps}")
    console.print(f"plot: {result.plot}\nruns: {result.out}")
    return out.getvalue()


def _phase(message: str) -> None:
    typer.echo(f"[bench learning {time.strftime('%H:%M:%S')}] {message}", err=True)


def run_logged(
    base: StackConfig, seed: int, out: Path, steps: int | None, timeout_s: float, runner: Runner, label: str
) -> SeedRun:
    """One seed's run, with a line on stderr as it starts and as it ends; ``label`` says which it is."""
    _phase(f"{label} in {out / f'seed-{seed}'}")
    run = run_seed(seeded_config(base, seed, out, steps), seed, runner, timeout_s)
    if run.report is None:
        _phase(f"{label} failed: {run.error.splitlines()[0]}")
    else:
        _phase(f"{label}: reward {run.report.reward_first:.3f} -> {run.report.reward_last:.3f}")
    return run


def run_seeds(
    base: StackConfig, seeds: list[int], out: Path, steps: int | None, timeout_s: float, runner: Runner
) -> list[SeedRun]:
    return [
        run_logged(base, seed, out, steps, timeout_s, runner, f"seed {seed} ({i + 1} of {len(seeds)})")
        for i, seed in enumerate(seeds)
    ]


def stack_runner(config: StackConfig) -> RunOutcome:
    """One run of the whole local stack, quiet, with its report; the bench's runs, unless a test stands in."""
    from commands.stack.run import run_stack

    return run_stack(config, quiet=True, keep_alive=False, report=True, title=f"bench learning {config.stack.run_id}")
