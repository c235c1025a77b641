"""``relayrl bench e2e``'s JSON: the per-mode figures each run adds, the limit its efficiency is
measured against (serial where trainer and engine share one GPU, the bottleneck otherwise), and what a
run cut short reports."""

from __future__ import annotations

import json

import pytest

from commands.stack.bench import GpuSplit, Measured, ModeResult, pipeline_limit, render_table, result_json
from commands.stack.environment import Calls
from commands.stack.workloads import get_workload


def _mode(
    samples_per_s: float, gpu_busy: float | None, mfu: float | None, by_handle: float | None = None
) -> ModeResult:
    return ModeResult(
        samples_per_s=samples_per_s,
        trainer_idle_ratio=0.1,
        rollout_idle_ratio=0.2,
        cpu_busy_ratio=0.5,
        weight_version_s=0.4,
        paused_per_version_s=0.01,
        engine_paused_per_version_s=0.005,
        queue_share_of_step=0.02,
        padding_ratio=0.3,
        max_step_wait_s=1.5,
        reward_at_end=0.7,
        staleness_violations=0,
        lost_groups=0,
        steps=10,
        env_calls=Calls(0, 0.0),
        window_s=30.0,
        engine_tokens_per_s=1234.56,
        trainer_mfu=mfu,
        gpu_busy_fraction=gpu_busy,
        weights_by_handle=by_handle,
        handle_fallbacks=0 if by_handle is None else 1,
    )


def _measured(sync: ModeResult | None, asynchronous: ModeResult | None) -> Measured:
    return Measured(12.0, 6.0, {"median": 64.0}, {}, sync, asynchronous)


ONE_GPU = GpuSplit(("NVIDIA H200",), {"trainer": ["0"], "engines": ["0"], "shared": True}, serial=True)


def test_the_serial_limit_is_the_two_stages_in_series_and_the_bottleneck_the_slower():
    assert pipeline_limit(12.0, 6.0, serial=True) == ("serial", pytest.approx(4.0))
    assert pipeline_limit(12.0, 6.0, serial=False) == ("bottleneck", 6.0)
    # Equal stages in series reach half of either.
    assert pipeline_limit(5.0, 5.0, serial=True)[1] == pytest.approx(2.5)


def test_on_one_gpu_the_json_names_the_gpu_the_serial_limit_and_each_modes_gpu_figures():
    result = result_json(
        get_workload("realistic"), "base", 10, 2, _measured(_mode(3.0, 0.6, 0.21, 1.0), _mode(3.8, 0.93, 0.25, 0.75)),
        {"engines": [0], "trainer": [1]}, dtype="bf16", gpus=ONE_GPU,
    )  # fmt: skip
    assert result["device"] == "cuda"
    assert result["gpus"] == {"names": ["NVIDIA H200"], "trainer": ["0"], "engines": ["0"], "shared": True}
    assert (result["limit"], result["limit_samples_per_s"]) == ("serial", 4.0)
    assert result["pipeline_efficiency"] == 0.95
    assert result["gpu_busy_fraction"] == {"sync": 0.6, "async": 0.93}
    assert result["trainer_mfu"] == {"sync": 0.21, "async": 0.25}
    assert result["engine_tokens_per_s"] == {"sync": 1234.6, "async": 1234.6}
    assert result["weight_version_s"] == {"sync": 0.4, "async": 0.4}
    assert result["window_s"] == {"sync": 30.0, "async": 30.0}
    # On the trainer's GPU versions also go by CUDA IPC handle: the share that did, and the fall backs.
    assert result["weights_by_handle"] == {"sync": 1.0, "async": 0.75}
    assert result["handle_fallbacks"] == {"sync": 1, "async": 1}
    json.loads(json.dumps(result))  # one JSON line
    table = render_table(result)
    assert "gpu_busy_fraction" in table and "limit: serial" in table


def test_on_cpu_the_limit_is_the_bottleneck_and_gpu_figures_are_none():
    result = result_json(
        get_workload("realistic"), "small", 10, 2, _measured(_mode(3.0, None, None), _mode(5.4, None, None)),
        {"engines": [0], "trainer": [1]},
    )  # fmt: skip
    assert (result["device"], result["gpus"]) == ("cpu", None)
    assert (result["limit"], result["limit_samples_per_s"], result["pipeline_efficiency"]) == ("bottleneck", 6.0, 0.9)
    assert result["gpu_busy_fraction"] == {"sync": None, "async": None}
    assert result["trainer_mfu"] == {"sync": None, "async": None}
    assert result["weights_by_handle"] == {"sync": None, "async": None}
    assert "gpu_busy_fraction" in render_table(result)


def test_gpus_of_their_own_keep_the_bottleneck_limit():
    own = GpuSplit(("A", "B"), {"trainer": ["0"], "engines": ["1"], "shared": False}, serial=False)
    result = result_json(
        get_workload("realistic"), "base", 10, 2, _measured(_mode(3.0, 0.5, 0.2), _mode(5.4, 0.9, 0.2)), {}, gpus=own
    )
    assert (result["limit"], result["pipeline_efficiency"]) == ("bottleneck", 0.9)


def test_a_whole_run_says_it_is_complete():
    measured = _measured(_mode(3.0, None, None), _mode(5.4, None, None))
    result = result_json(get_workload("toy"), "tiny", 10, 2, measured, {})
    assert (result["complete"], result["stopped"]) == (True, None)
    assert "cut short" not in render_table(result)


def test_a_run_cut_in_the_sync_pipeline_keeps_the_targets_figures_and_names_what_it_lacks():
    # The asynchronous pipeline runs before the synchronous one: its figures and the limit survive the cut.
    result = result_json(
        get_workload("realistic"), "base", 10, 2, _measured(None, _mode(3.8, 0.93, 0.25)), {}, gpus=ONE_GPU,
        stopped="sync pipeline (η = 0, 10 steps): interrupted",
    )  # fmt: skip
    assert (result["complete"], result["stopped"]) == (False, "sync pipeline (η = 0, 10 steps): interrupted")
    assert result["pipeline_efficiency"] == 0.95
    assert (result["async_samples_per_s"], result["sync_samples_per_s"], result["speedup"]) == (3.8, None, None)
    assert result["gpu_busy_fraction"] == {"sync": None, "async": 0.93}
    assert (result["staleness_violations"], result["lost_groups"]) == (0, 0)
    json.loads(json.dumps(result))
    assert "cut short" in render_table(result)


def test_a_run_cut_before_the_trainer_alone_finished_keeps_the_engines_figure_only():
    measured = Measured(engine_samples_per_s=12.0, generated_lengths={"median": 64.0})
    result = result_json(get_workload("agentic"), "tiny", 10, 2, measured, {}, stopped="engine alone: interrupted")
    assert result["engine_alone_samples_per_s"] == 12.0
    assert result["trainer_alone_samples_per_s"] is None
    assert (result["limit"], result["limit_samples_per_s"], result["pipeline_efficiency"]) == (None, None, None)
    assert result["env_calls"] == {"sync": None, "async": None}
    assert "engine_alone_samples_per_s: 12.0" in render_table(result)


@pytest.mark.parametrize(("dtype", "engine_dtype"), [("fp32", "float32"), ("bf16", "bfloat16")])
def test_the_bench_dtype_sets_what_the_trainer_computes_and_publishes_and_what_the_engine_loads(
    tmp_path, dtype, engine_dtype
):
    from commands.stack.bench import BenchRun

    run = BenchRun(tmp_path, tmp_path / "model", tmp_path / "data.jsonl", get_workload("toy"), 0, 60.0, dtype=dtype)
    config = run.config("async", eta=1, steps=3)
    assert (config.trainer["param_dtype"], config.trainer["rollout_dtype"]) == (dtype, dtype)
    assert config.engine["dtype"] == engine_dtype
