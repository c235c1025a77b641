"""`relayrl bench weights`' arithmetic on recorded samples: per-version deltas, medians, the targets."""

from __future__ import annotations

import pytest

from commands.stack.weights_figures import (
    Histogram,
    VersionSample,
    bench_result,
    histogram_delta,
    rank0_memory_bound,
    replica_run_figures,
    targets,
    version_figures,
)
from services.trainer.publish_bench import PublishedVersion

MODEL = 1_000_000
MIB = 1 << 20


def _totals(fetch: tuple[float, int], apply: tuple[float, int], paused: tuple[float, int]) -> dict[str, Histogram]:
    return {"fetch_s": Histogram(*fetch), "apply_s": Histogram(*apply), "paused_s": Histogram(*paused)}


def _sample(
    version: int, step_end: float, fetch: float, apply: float, paused: float, applied: float, engine_paused: float
) -> VersionSample:
    """Version ``version`` at one replica and its engine, whose histograms had seen ``version - 1``
    versions of 1 s each."""
    n = version - 1
    before = {"rollout-0": _totals((n, n), (n, n), (n, n)), "engine-0": {"engine_paused_s": Histogram(n, n)}}
    after = {
        "rollout-0": _totals((n + fetch, n + 1), (n + apply, n + 1), (n + paused, n + 1)),
        "engine-0": {"engine_paused_s": Histogram(n + engine_paused, n + 1)},
    }
    published = PublishedVersion(version, step_end, 0.01 * version, 0.02 * version, MODEL, MODEL)
    return VersionSample(
        published,
        applied_at_unix_s={"rollout-0": step_end + applied},
        first_token_at_unix_s={"engine-0": step_end + applied + 0.005},
        before=before,
        after=after,
    )


# Version 1 pays one-off costs (10 s fetch); versions 2-4 are the steady state.
SAMPLES = [
    _sample(1, 1000.0, fetch=10.0, apply=0.5, paused=0.6, applied=11.0, engine_paused=0.4),
    _sample(2, 1100.0, fetch=0.2, apply=0.05, paused=0.04, applied=0.30, engine_paused=0.02),
    _sample(3, 1200.0, fetch=0.4, apply=0.07, paused=0.06, applied=0.50, engine_paused=0.04),
    _sample(4, 1300.0, fetch=0.3, apply=0.06, paused=0.05, applied=0.40, engine_paused=0.03),
]


def test_a_stage_is_the_histograms_growth_over_the_version() -> None:
    assert histogram_delta(Histogram(2.0, 2), Histogram(2.25, 3), "fetch") == pytest.approx(0.25)
    # Two observations in one version (a failed load retried): their mean.
    assert histogram_delta(Histogram(1.0, 1), Histogram(2.0, 3), "fetch") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="rollout-0 fetch_s of v3: no observation"):
        histogram_delta(Histogram(1.0, 1), Histogram(1.0, 1), "rollout-0 fetch_s of v3")


def test_one_versions_figures_count_from_the_trainers_step_end() -> None:
    two_replicas = VersionSample(
        SAMPLES[1].published,
        applied_at_unix_s={"rollout-0": 1100.3, "rollout-1": 1100.45},
        first_token_at_unix_s={"engine-0": 1100.31, "engine-1": 1100.5},
        before={
            **SAMPLES[1].before,
            "rollout-1": SAMPLES[1].before["rollout-0"],
            "engine-1": {"engine_paused_s": Histogram(0.0, 0)},
        },
        after={
            **SAMPLES[1].after,
            "rollout-1": SAMPLES[1].after["rollout-0"],
            "engine-1": {"engine_paused_s": Histogram(0.01, 1)},
        },
    )
    figures = version_figures(two_replicas)
    assert figures["gather_s"] == pytest.approx(0.02) and figures["upload_s"] == pytest.approx(0.04)
    assert figures["fetch_s"] == pytest.approx({"rollout-0": 0.2, "rollout-1": 0.2})
    # Each engine's own pause, apart from the replicas' stages.
    assert figures["engine_paused_s"] == pytest.approx({"engine-0": 0.02, "engine-1": 0.01})
    assert figures["first_token_s"] == pytest.approx({"engine-0": 0.31, "engine-1": 0.5})
    assert figures["applied_s"] == pytest.approx({"rollout-0": 0.3, "rollout-1": 0.45})
    # Applied at every replica: the last of them.
    assert figures["total_s"] == pytest.approx(0.45)


def test_medians_leave_out_the_first_version_which_is_reported_apart() -> None:
    run = replica_run_figures(SAMPLES, {"trainer_rank0": 2 * MODEL, "engine-0": 3 * MODEL}, trainer_ranks=2)
    median = run["median"]
    assert median["total_s"] == pytest.approx(0.40)
    assert median["fetch_s"] == pytest.approx({"rollout-0": 0.3})
    assert median["apply_s"] == pytest.approx({"rollout-0": 0.06})
    assert median["paused_s"] == pytest.approx({"rollout-0": 0.05})
    assert median["engine_paused_s"] == pytest.approx({"engine-0": 0.03})
    assert median["gather_s"] == pytest.approx(0.03)
    assert run["first_version"]["total_s"] == pytest.approx(11.0)
    assert run["first_version"]["fetch_s"] == pytest.approx({"rollout-0": 10.0})
    assert run["peak_memory"]["engine-0"] == {"bytes": 3 * MODEL, "x_model": 3.0}
    grown = replica_run_figures(
        SAMPLES, {"trainer_rank0": 2 * MODEL}, trainer_ranks=2, start_bytes={"trainer_rank0": MODEL}
    )
    assert grown["peak_memory"]["trainer_rank0"] == {"bytes": 2 * MODEL, "x_model": 2.0, "above_start_bytes": MODEL}
    with pytest.raises(ValueError, match="at least two versions"):
        replica_run_figures(SAMPLES[:1], {}, trainer_ranks=2)


def _run(total_s: float, paused_s: float, apply_s: float, rank0_bytes: int) -> dict:
    # The replica saw a longer pause than the engine (the calls' round trips): the targets use the engine's.
    median = {
        "total_s": total_s,
        "paused_s": {"rollout-0": paused_s + 1.0},
        "engine_paused_s": {"engine-0": paused_s},
        "apply_s": {"rollout-0": apply_s},
    }
    return {
        "median": median,
        "model_bytes": MODEL,
        "bucket_bytes": MODEL // 4,
        "trainer_ranks": 2,
        "peak_memory": {"trainer_rank0": {"bytes": rank0_bytes}},
    }


def test_every_target_is_computed_from_the_figures() -> None:
    bound = rank0_memory_bound(_run(1.0, 0.0, 0.0, 0))
    assert bound == pytest.approx(MODEL / 2 + MODEL / 4 + MODEL / 10)
    met = {1: _run(0.030, 0.005, 0.010, int(bound)), 2: _run(0.038, 0.005, 0.010, int(bound))}
    assert targets("tiny", met, raw_tcp_s=0.010) == {
        "ratio_to_raw_tcp_le_3": True,
        "two_replicas_le_1_3x_one": True,
        "pause_le_apply": True,
        "pause_le_25pct_of_total": True,
        "rank0_peak_le_shard_bucket_10pct": True,
        "tiny_total_le_50ms": True,
    }
    missed = {1: _run(0.031, 0.011, 0.010, int(bound) + 1), 2: _run(0.060, 0.015, 0.020, int(bound))}
    assert targets("tiny", missed, raw_tcp_s=0.010) == {
        "ratio_to_raw_tcp_le_3": False,
        "two_replicas_le_1_3x_one": False,
        "pause_le_apply": False,
        "pause_le_25pct_of_total": False,
        "rank0_peak_le_shard_bucket_10pct": False,
        "tiny_total_le_50ms": False,
    }


def test_rank0_growth_during_publish_is_held_to_a_bucket_and_a_tenth_of_the_model() -> None:
    # Bucket MODEL / 4, slack MODEL / 10: growth may reach 0.35 MODEL whatever the peak itself.
    run = _run(1.0, 0.0, 0.0, 10 * MODEL)
    run["peak_memory"]["trainer_rank0"]["above_start_bytes"] = int(0.35 * MODEL)
    checks = targets("small", {1: run}, raw_tcp_s=1.0)
    assert checks["rank0_publish_growth_le_bucket_10pct"] is True
    assert checks["rank0_peak_le_shard_bucket_10pct"] is False
    run["peak_memory"]["trainer_rank0"]["above_start_bytes"] = int(0.36 * MODEL)
    assert targets("small", {1: run}, raw_tcp_s=1.0)["rank0_publish_growth_le_bucket_10pct"] is False


def test_targets_without_their_figures_are_left_out() -> None:
    only_two = targets("small", {2: _run(1.0, 0.1, 0.2, MODEL)}, raw_tcp_s=0.5)
    assert only_two.keys() == {"pause_le_apply", "pause_le_25pct_of_total", "rank0_peak_le_shard_bucket_10pct"}


def test_the_result_relates_each_replica_count_to_the_references() -> None:
    runs = {1: replica_run_figures(SAMPLES, {"trainer_rank0": MODEL}, 2)}
    result = bench_result("small", 4, runs, raw_tcp_s=0.002, memcpy_s=0.0005, cpu_split={"engines": [0]})
    assert result["by_replicas"]["1"]["ratio_to_raw_tcp"] == pytest.approx(200.0)
    assert result["raw_tcp_gb_per_s"] == pytest.approx(0.5) and result["memcpy_gb_per_s"] == pytest.approx(2.0)
    assert result["model_bytes"] == MODEL and result["versions"] == 4
    assert result["targets"]["ratio_to_raw_tcp_le_3"] is False and "tiny_total_le_50ms" not in result["targets"]
