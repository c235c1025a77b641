"""``relayrl bench staleness``: fixed η = 0, 1, 2, 4 and ``max_staleness: auto`` on one workload and seed.

Each mode runs the full pipeline of ``relayrl bench e2e`` (:func:`commands.stack.bench.run_mode`),
one after another, on the same workload, model, dataset, seed and CPU split. Per mode:
samples/s (first to last training step), the trainer's idle share, the mean and max age of the
samples trained (policy versions), the mean ``|log π_prox − log π_behav|`` (off-policy drift, the
signal auto lowers η on), and for auto the η it held on average and at the end.

``--learning`` then runs the reasoning recipe (``commands/stack/configs/long_add.yaml``, or
``--learning-config``) per mode with ``--seeds`` seeds each through ``relayrl bench learning``'s
machinery, every run the same number of trainer steps, and reports each mode's held-out score at
that step (``val_last``), per seed. Start it from an SFT warm start (``--model-dir``), as the
recipe says: from a random model every held-out score is 0.

The targets of issue #49 are computed in the JSON: ``auto_vs_best_fixed`` (auto's samples/s over
the best fixed η's; target ≥ 0.95) and ``smallest_fixed_at_auto_speed`` (the smallest fixed η
whose samples/s reaches 0.95 × the best, whose mean sample age auto's should not exceed).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from commands.stack.bench import PRESETS, BenchRun, ModeResult, _init_model, log_tails, run_mode
from commands.stack.config import StackSettings
from commands.stack.report import read_metrics
from commands.stack.workloads import get_workload

MODES = ("0", "1", "2", "4", "auto")
RECIPE = Path(__file__).parent / "configs" / "long_add.yaml"
# auto's samples/s must reach this share of the best fixed η's (issue #49).
SPEED_SHARE = 0.95
DRIFT = "training/rollout_logprob_abs_diff_mean"


@dataclass(frozen=True, slots=True)
class LearningSpec:
    """``--learning``: the recipe, its warm start, and how many runs of how many steps per mode."""

    config: Path
    model_dir: Path | None
    seeds: int
    steps: int | None
    out: Path
    timeout_s: float


def mode_settings(mode: str, limit: int, adjust_every: int) -> tuple[int, dict[str, Any]]:
    """(the stack's η, the trainer's overrides) of one mode. Under auto every other service keeps the
    limit, its loosest bound; the trainer alone picks η below it."""
    if mode == "auto":
        return limit, {"max_staleness": "auto", "max_staleness_limit": limit, "staleness_adjust_every": adjust_every}
    return int(mode), {}


def staleness_figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Sample age, drift and η over a run's training steps (metrics.jsonl rows)."""
    trained = [r for r in rows if "trainer/global_steps" in r and "staleness/avg_sample_age" in r]
    drift = [r[DRIFT] for r in trained if DRIFT in r]
    etas = [r["staleness/eta"] for r in trained if "staleness/eta" in r]
    return {
        "mean_sample_age": statistics.fmean(r["staleness/avg_sample_age"] for r in trained),
        "max_sample_age": max(r["staleness/max_sample_age"] for r in trained),
        "mean_abs_log_ratio": statistics.fmean(drift) if drift else 0.0,
        "eta_mean": statistics.fmean(etas) if etas else 0.0,
        "eta_last": etas[-1] if etas else 0.0,
    }


def mode_json(result: ModeResult, figures: dict[str, float]) -> dict[str, float]:
    return {
        "samples_per_s": round(result.samples_per_s, 3),
        "trainer_idle_ratio": round(result.trainer_idle_ratio, 3),
        "mean_sample_age": round(figures["mean_sample_age"], 3),
        "max_sample_age": figures["max_sample_age"],
        "mean_abs_log_ratio": round(figures["mean_abs_log_ratio"], 6),
        "eta_mean": round(figures["eta_mean"], 2),
        "eta_last": figures["eta_last"],
        "staleness_violations": result.staleness_violations,
        "lost_groups": result.lost_groups,
        "steps": result.steps,
    }


def targets(modes: dict[str, dict[str, float]]) -> dict[str, Any]:
    """auto against the fixed modes that ran (empty without auto or without a fixed mode)."""
    fixed = {m: r for m, r in modes.items() if m != "auto"}
    if "auto" not in modes or not fixed:
        return {}
    best = max(r["samples_per_s"] for r in fixed.values())
    fast = sorted((int(m) for m, r in fixed.items() if r["samples_per_s"] >= SPEED_SHARE * best))
    smallest = str(fast[0])
    auto = modes["auto"]
    return {
        "auto_vs_best_fixed": round(auto["samples_per_s"] / best, 3) if best > 0 else None,
        "smallest_fixed_at_auto_speed": int(smallest),
        "auto_mean_age_vs_that_fixed": round(auto["mean_sample_age"] - fixed[smallest]["mean_sample_age"], 3),
    }


def learning_modes(modes: list[str], limit: int, adjust_every: int, spec: LearningSpec) -> dict[str, Any]:
    """Each mode's held-out scores at the same trainer step, ``spec.seeds`` runs each, via bench learning."""
    from commands.stack.cli import _load_config
    from commands.stack.learning import run_seeds, stack_runner

    base = _load_config(spec.config)
    if spec.model_dir is not None:
        base.stack.model_dir = spec.model_dir.resolve()
    found: dict[str, Any] = {}
    for mode in modes:
        eta, overrides = mode_settings(mode, limit, adjust_every)
        mode_config = base.model_copy(deep=True)
        mode_config.stack.max_staleness = eta
        mode_config.trainer.update(overrides)
        out = spec.out / f"mode-{mode}"
        runs = run_seeds(mode_config, list(range(spec.seeds)), out, spec.steps, spec.timeout_s, stack_runner)
        scores: dict[str, list[float | None]] = {}
        for run in runs:
            val_last = run.report.val_last if run.report is not None else {}
            for key in sorted({k for r in runs if r.report for k in r.report.val_last}):
                scores.setdefault(key, []).append(round(val_last[key], 3) if key in val_last else None)
        at = [run.report.steps for run in runs if run.report is not None]
        found[mode] = {"val_last": scores, "steps": at, "failed": sum(run.report is None for run in runs)}
    return found


def _phase(message: str) -> None:
    typer.echo(f"[bench staleness {time.strftime('%H:%M:%S')}] {message}", err=True)


def bench(
    workload: Annotated[str, typer.Option(help="toy, realistic or agentic (as bench e2e).")] = "realistic",
    preset: Annotated[str, typer.Option(help="Model preset: tiny, small or base.")] = "small",
    steps: Annotated[int, typer.Option(min=3, help="Trainer steps per mode.")] = 30,
    modes: Annotated[str, typer.Option(help="Comma-separated modes to run, of 0,1,2,4,auto.")] = ",".join(MODES),
    limit: Annotated[int, typer.Option(min=0, help="auto's max_staleness_limit.")] = 4,
    adjust_every: Annotated[int, typer.Option(min=1, help="auto's staleness_adjust_every (steps per decision).")] = 5,
    seed: Annotated[int, typer.Option(help="Seed of the dataset and the trainer, the same in every mode.")] = 0,
    learning: Annotated[
        bool, typer.Option("--learning", help="Also the held-out score at equal steps on the reasoning recipe.")
    ] = False,
    seeds: Annotated[int, typer.Option(min=1, help="--learning: runs (seeds 0..N-1) per mode.")] = 3,
    learning_config: Annotated[
        Path | None,
        typer.Option(
            help="--learning: the stack YAML of the recipe (default: the long_add recipe, configs/long_add.yaml)."
        ),
    ] = None,
    learning_steps: Annotated[
        int | None, typer.Option(min=1, help="--learning: trainer steps of every run (default: the recipe's).")
    ] = None,
    model_dir: Annotated[
        Path | None, typer.Option(help="--learning: the warm start every run begins from (an SFT's output).")
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="Longest run per mode (and per learning seed), seconds.")] = 1800,
    json_out: Annotated[Path | None, typer.Option(help="Also write the JSON object to this file.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line only.")] = False,
) -> None:
    """Fixed η = 0, 1, 2, 4 and auto on one workload and seed: samples/s, idle, sample age, drift (and learning)."""
    try:
        chosen = get_workload(workload)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--workload") from None
    if preset not in PRESETS:
        raise typer.BadParameter(
            f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}", param_hint="--preset"
        )
    wanted = [m.strip() for m in modes.split(",") if m.strip()]
    if not wanted or any(m not in MODES for m in wanted):
        raise typer.BadParameter(f"modes are among {', '.join(MODES)}, got {modes!r}", param_hint="--modes")
    from commands.stack.cpus import plan_cpus

    cpu_split = plan_cpus(StackSettings().cpus, replicas=1, trainer_procs=1).describe()
    per_mode: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="relayrl-bench-staleness-") as tmp:
        work = Path(tmp)
        _phase(f"{chosen.name} workload, {preset} preset, modes {', '.join(wanted)}, {steps} steps each")
        model = _init_model(work, preset)
        dataset = chosen.write_dataset(work / f"{chosen.name}.jsonl", 4096, seed)
        base = BenchRun(work, model, dataset, chosen, seed, timeout_s)
        for mode in wanted:
            eta, overrides = mode_settings(mode, limit, adjust_every)
            _phase(f"η = {mode}")
            try:
                result = run_mode(dataclasses.replace(base, trainer_overrides=overrides), eta, steps, f"mode-{mode}")
            except Exception:
                log_tails(work)
                raise
            figures = staleness_figures(read_metrics(work / "runs" / f"mode-{mode}" / "metrics.jsonl"))
            per_mode[mode] = mode_json(result, figures)
            _phase(f"η = {mode}: {result.samples_per_s:.2f} samples/s, mean age {figures['mean_sample_age']:.2f}")
        found = {
            "benchmark": "staleness",
            "workload": chosen.name,
            "preset": preset,
            "steps": steps,
            "seed": seed,
            "limit": limit,
            "adjust_every": adjust_every,
            "cpu_split": cpu_split,
            "modes": per_mode,
            **targets(per_mode),
        }
        if learning:
            recipe = learning_config or RECIPE
            spec = LearningSpec(recipe, model_dir, seeds, learning_steps, work / "learning", timeout_s)
            _phase(f"learning: {recipe.name}, {seeds} seeds per mode")
            found["learning"] = learning_modes(wanted, limit, adjust_every, spec)
    if json_out is not None:
        json_out.write_text(json.dumps(found) + "\n")
    typer.echo(json.dumps(found) if json_output else json.dumps(found, indent=1))
