"""`relayrl bench weights` end to end on the tiny model: every stage of every version is measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

STAGES = (
    "gather_s",
    "upload_s",
    "fetch_s",
    "apply_s",
    "paused_s",
    "engine_paused_s",
    "first_token_s",
    "applied_s",
    "total_s",
)
TARGETS = {
    "ratio_to_raw_tcp_le_3",
    "pause_le_apply",
    "pause_le_25pct_of_total",
    "rank0_peak_le_shard_bucket_10pct",
    "rank0_publish_growth_le_bucket_10pct",
    "tiny_total_le_50ms",
}


def _positive_stages(figures: dict, replica: str, engine: str) -> None:
    assert figures.keys() == set(STAGES)
    for stage in ("gather_s", "upload_s", "total_s"):
        assert figures[stage] > 0, stage
    for stage in ("fetch_s", "apply_s", "paused_s", "applied_s"):
        assert figures[stage].keys() == {replica} and figures[stage][replica] > 0, stage
    for stage in ("engine_paused_s", "first_token_s"):
        assert figures[stage].keys() == {engine} and figures[stage][engine] > 0, stage
    assert figures["total_s"] == figures["applied_s"][replica]


def test_the_tiny_bench_times_each_stage_of_every_version() -> None:
    argv = [sys.executable, "-m", "commands.cli", "bench", "weights", "--preset", "tiny", "--replicas", "1"]
    done = subprocess.run([*argv, "--versions", "2", "--json"], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["benchmark"], result["preset"], result["versions"]) == ("weights", "tiny", 2)
    assert result["by_replicas"].keys() == {"1"}
    run = result["by_replicas"]["1"]
    _positive_stages(run["median"], "rollout-0", "engine-0")
    _positive_stages(run["first_version"], "rollout-0", "engine-0")
    # The tiny model's bytes as published: ~260 k fp32 parameters.
    assert 0.5e6 < result["model_bytes"] == run["model_bytes"] < 2e6
    assert run["peak_memory"].keys() == {"trainer_rank0", "paramsync", "engine-0"}
    for peak in run["peak_memory"].values():
        assert peak["bytes"] > 0
        assert peak["x_model"] == pytest.approx(peak["bytes"] / result["model_bytes"], rel=1e-4)
        assert 0 <= peak["above_start_bytes"] <= peak["bytes"]
    assert result["raw_tcp_s"] > 0 and result["memcpy_s"] > 0
    assert run["ratio_to_raw_tcp"] == pytest.approx(run["median"]["total_s"] / result["raw_tcp_s"], rel=1e-4)
    assert result["targets"].keys() == TARGETS
    assert all(isinstance(met, bool) for met in result["targets"].values())
    # By default nothing is pinned: this trainer only publishes, so no CPU is kept for it.
    assert result["cpu_split"]["engines"] == result["cpu_split"]["trainer"] == "all"
    everywhere = sorted(os.sched_getaffinity(0))
    assert run["cpus"] == {name: everywhere for name in ("trainer_rank0", "paramsync", "engine-0")}
    # Stages are announced on stderr while they run, the placement first.
    assert "tiny preset, CPUs {'engines': 'all'" in done.stderr
    assert "version 2 applied at every replica" in done.stderr


def test_the_lora_bench_publishes_and_applies_the_adapter_alone(tiny_model_dir) -> None:
    from relayrl.models.loading import load_causal_lm
    from services.trainer import lora
    from services.trainer.config import ALL_LINEAR
    from services.trainer.gather import published_items, weight_specs

    argv = [sys.executable, "-m", "commands.cli", "bench", "weights", "--preset", "tiny", "--replicas", "1"]
    # Pinned as a training stack is (`--cpus auto`): the placement the run reports is the one it had.
    done = subprocess.run(
        [*argv, "--versions", "2", "--lora-rank", "4", "--cpus", "auto", "--json"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["lora_rank"] == 4
    split = result["cpu_split"]
    assert split["engines"] and split["trainer"] and not set(split["engines"]) & set(split["trainer"])
    # The processes ran where the split says.
    cpus = result["by_replicas"]["1"]["cpus"]
    assert (cpus["engine-0"], cpus["paramsync"], cpus["trainer_rank0"]) == (
        split["engines"],
        split["services"],
        split["trainer"],
    )
    adapted = lora.add_adapter(load_causal_lm(tiny_model_dir), lora.LoraSpec(4, 16.0, ALL_LINEAR))
    assert result["model_bytes"] == sum(spec.num_bytes for spec in weight_specs(published_items(adapted)))
    # Each version reached the replica (as an adapter) and the engine answered with it. A few
    # hundred kB upload within the gather they run beside, so upload_s may be 0.
    median = result["by_replicas"]["1"]["median"]
    assert median["gather_s"] > 0 and median["total_s"] == median["applied_s"]["rollout-0"] > 0
    for stage in ("fetch_s", "apply_s", "paused_s"):
        assert median[stage]["rollout-0"] > 0, stage
    assert median["first_token_s"]["engine-0"] > 0 and median["engine_paused_s"]["engine-0"] > 0


def test_an_unknown_cpu_placement_is_a_clear_error() -> None:
    argv = [sys.executable, "-m", "commands.cli", "bench", "weights", "--cpus", "sometimes"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    message = " ".join(done.stderr.replace("│", " ").split())
    assert "choose one of off, auto" in message and "Traceback" not in message
