"""The figures of ``relayrl bench weights``, computed from what one run recorded per version.

Kept apart from the orchestration (:mod:`commands.stack.bench_weights`) so the arithmetic (per-version
deltas of the rollout's histograms, medians, the issue #18 target checks) is tested on recorded
samples without starting a process. Times are Unix seconds, because they come from different
processes (the trainer's step end, paramsync's version table, the bench's token streams).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.trainer.publish_bench import PublishedVersion

# The rollout's histograms whose per-version deltas give a stage's seconds (metric families
# without the ``_sum``/``_count`` suffix).
ROLLOUT_HISTOGRAMS = {
    "fetch_s": "relayrl_rollout_weight_fetch_seconds",
    "apply_s": "relayrl_rollout_weight_apply_seconds",
    "paused_s": "relayrl_rollout_generation_paused_seconds",
}
# The engine's own: how long its scheduler took no step for the version (a pause to its continue,
# or the update run between two steps). What the replica sees (``paused_s``) also holds the calls'
# round trips and, for a one-call switch, the time the engine goes on generating while it maps the
# file and ends its running step; this is the pause the targets are about.
ENGINE_HISTOGRAMS = {"engine_paused_s": "relayrl_engine_generation_paused_seconds"}

# Issue #18's targets, as written there.
MAX_RATIO_TO_RAW_TCP = 3.0
MAX_TWO_REPLICA_SLOWDOWN = 1.3
MAX_PAUSE_SHARE_OF_TOTAL = 0.25
RANK0_SLACK_SHARE_OF_MODEL = 0.10
MAX_TINY_TOTAL_S = 0.050


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram's ``_sum`` and ``_count`` at one moment."""

    sum: float
    count: float


@dataclass(frozen=True, slots=True)
class VersionSample:
    """Everything recorded for one version; dict keys are replica (or engine) names."""

    published: PublishedVersion
    # paramsync's version table: when each replica reported holding the version.
    applied_at_unix_s: Mapping[str, float]
    # When each engine's first response generated with the version arrived.
    first_token_at_unix_s: Mapping[str, float]
    # Each replica's histograms (keys of ROLLOUT_HISTOGRAMS) and each engine's (keys of
    # ENGINE_HISTOGRAMS), by name, before and after the version.
    before: Mapping[str, Mapping[str, Histogram]]
    after: Mapping[str, Mapping[str, Histogram]]


def histogram_delta(before: Histogram, after: Histogram, what: str) -> float:
    """Seconds of the observations made between two readings (their mean when there were several)."""
    observed = after.count - before.count
    if observed < 1:
        raise ValueError(f"{what}: no observation between the two readings (count {before.count} -> {after.count})")
    return (after.sum - before.sum) / observed


def version_figures(sample: VersionSample) -> dict[str, Any]:
    """One version's seconds per stage; per-replica and per-engine stages as dicts by name."""
    p = sample.published
    figures: dict[str, Any] = {"gather_s": p.gather_s, "upload_s": p.upload_s}
    for stage in (*ROLLOUT_HISTOGRAMS, *ENGINE_HISTOGRAMS):
        figures[stage] = {
            name: histogram_delta(
                sample.before[name][stage], sample.after[name][stage], f"{name} {stage} of v{p.version}"
            )
            for name in sorted(sample.after)
            if stage in sample.after[name]
        }
    figures["first_token_s"] = {
        engine: at - p.step_end_unix_s for engine, at in sorted(sample.first_token_at_unix_s.items())
    }
    figures["applied_s"] = {replica: at - p.step_end_unix_s for replica, at in sorted(sample.applied_at_unix_s.items())}
    figures["total_s"] = max(figures["applied_s"].values())
    return figures


def median_figures(per_version: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over versions (of each name, for per-replica figures)."""
    if not per_version:
        raise ValueError("no versions to take medians over")
    out: dict[str, Any] = {}
    for key, value in per_version[0].items():
        if isinstance(value, dict):
            out[key] = {name: statistics.median(v[key][name] for v in per_version) for name in value}
        else:
            out[key] = statistics.median(v[key] for v in per_version)
    return out


def replica_run_figures(
    samples: Sequence[VersionSample],
    peak_bytes: Mapping[str, int],
    trainer_ranks: int,
    start_bytes: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The figures of one replica count: medians over every version after the first, the first apart,
    and peak resident memory as bytes and as multiples of the model's bytes, with its growth over
    ``start_bytes`` (the resident size before the first version) where given."""
    if len(samples) < 2:
        raise ValueError("need at least two versions: the first is reported apart from the medians")
    per_version = [version_figures(s) for s in samples]
    model_bytes = samples[0].published.model_bytes
    return {
        "median": median_figures(per_version[1:]),
        "first_version": per_version[0],
        "model_bytes": model_bytes,
        "bucket_bytes": max(s.published.bucket_bytes for s in samples),
        "trainer_ranks": trainer_ranks,
        "peak_memory": {
            name: {
                "bytes": value,
                "x_model": value / model_bytes,
                **({"above_start_bytes": value - start_bytes[name]} if start_bytes and name in start_bytes else {}),
            }
            for name, value in sorted(peak_bytes.items())
        },
    }


def targets(preset: str, runs: Mapping[int, dict[str, Any]], raw_tcp_s: float) -> dict[str, bool]:
    """Issue #18's checks on the figures; a check whose figures this run did not measure is left out."""
    checks: dict[str, bool] = {}
    if 1 in runs:
        checks["ratio_to_raw_tcp_le_3"] = runs[1]["median"]["total_s"] / raw_tcp_s <= MAX_RATIO_TO_RAW_TCP
    if 1 in runs and 2 in runs:
        checks["two_replicas_le_1_3x_one"] = (
            runs[2]["median"]["total_s"] <= MAX_TWO_REPLICA_SLOWDOWN * runs[1]["median"]["total_s"]
        )
    medians = [run["median"] for run in runs.values()]
    checks["pause_le_apply"] = all(
        paused <= m["apply_s"][replica_of(engine)] for m in medians for engine, paused in m["engine_paused_s"].items()
    )
    checks["pause_le_25pct_of_total"] = all(
        paused <= MAX_PAUSE_SHARE_OF_TOTAL * m["total_s"] for m in medians for paused in m["engine_paused_s"].values()
    )
    checks["rank0_peak_le_shard_bucket_10pct"] = all(
        run["peak_memory"]["trainer_rank0"]["bytes"] <= rank0_memory_bound(run) for run in runs.values()
    )
    # The same bound on what publishing added to rank 0, its shard and the process's libraries left out.
    growths = [run["peak_memory"]["trainer_rank0"].get("above_start_bytes") for run in runs.values()]
    if growths and None not in growths:
        checks["rank0_publish_growth_le_bucket_10pct"] = all(
            growth <= run["bucket_bytes"] + RANK0_SLACK_SHARE_OF_MODEL * run["model_bytes"]
            for growth, run in zip(growths, runs.values(), strict=True)
        )
    if preset == "tiny":
        checks["tiny_total_le_50ms"] = all(m["total_s"] <= MAX_TINY_TOTAL_S for m in medians)
    return checks


def replica_of(engine: str) -> str:
    """The rollout replica that drives an engine: the stack pairs ``engine-<i>`` with ``rollout-<i>``."""
    return engine.replace("engine-", "rollout-", 1)


def rank0_memory_bound(run: Mapping[str, Any]) -> float:
    """Model bytes per rank + one bucket + 10 % of the model's bytes."""
    model = run["model_bytes"]
    return model / run["trainer_ranks"] + run["bucket_bytes"] + RANK0_SLACK_SHARE_OF_MODEL * model


def bench_result(
    preset: str,
    versions: int,
    runs: Mapping[int, dict[str, Any]],
    raw_tcp_s: float,
    memcpy_s: float,
    cpu_split: Mapping[str, object],
    lora_rank: int = 0,
) -> dict[str, Any]:
    """The bench's JSON object: each replica count's figures, the references and the target checks
    (``model_bytes``: what one version moves, the adapter's bytes when ``lora_rank`` > 0)."""
    model_bytes = next(iter(runs.values()))["model_bytes"]
    by_replicas = {
        str(count): {**run, "ratio_to_raw_tcp": run["median"]["total_s"] / raw_tcp_s} for count, run in runs.items()
    }
    return _rounded(
        {
            "benchmark": "weights",
            "preset": preset,
            "lora_rank": lora_rank,
            "versions": versions,
            "model_bytes": model_bytes,
            "raw_tcp_s": raw_tcp_s,
            "raw_tcp_gb_per_s": model_bytes / raw_tcp_s / 1e9,
            "memcpy_s": memcpy_s,
            "memcpy_gb_per_s": model_bytes / memcpy_s / 1e9,
            "by_replicas": by_replicas,
            "targets": targets(preset, runs, raw_tcp_s),
            "cpu_split": dict(cpu_split),
        }
    )


def _rounded(value: Any) -> Any:
    """Floats to 6 significant digits, all the way down (the JSON stays readable, milliseconds kept)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value
