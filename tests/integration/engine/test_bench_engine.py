"""``relayrl bench engine`` on CPU, briefly: the command a GPU session runs with ``--device cuda
--preset base`` works end to end and prints the figures it promises, for each attention backend
it is given, in one run, with a profile of decode steps when asked, a backend whose engine does
not start reported as failed beside the others' figures; and with ``--timeout-s`` a
workload still running at its deadline is cut, rated over what streamed until then, and leaves the
engine idle."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commands.cli import app
from commands.stack.progress import read_samples
from services.engine.bench import Workload, _cache_for, block_tokens, engine_process, stream_workload
from tests.waiting import wait_until


def test_the_workload_is_nano_vllms_and_fixed_by_its_seed() -> None:
    work = Workload.nano_vllm(requests=50, min_len=100, max_len=1024, vocab=151936)

    assert work == Workload.nano_vllm(requests=50, min_len=100, max_len=1024, vocab=151936)
    assert all(100 <= len(p) <= 1024 for p in work.prompts) and all(100 <= n <= 1024 for n in work.output_lens)
    assert max(max(p) for p in work.prompts) <= 10_000
    assert len({len(p) for p in work.prompts}) > 10, "lengths vary"


def test_generate_batchs_cache_holds_every_request_at_once_and_no_more() -> None:
    work = Workload.nano_vllm(requests=50, min_len=100, max_len=1024, vocab=151936)
    config = _cache_for(work)
    tokens = block_tokens(config)
    needed = [len(prompt) + work.mean_output for prompt in work.prompts]
    assert sum(needed) <= config.num_blocks * tokens <= sum(needed) + len(needed) * tokens


def test_bench_engine_prints_one_json_line_with_every_figure_for_each_attention_backend() -> None:
    args = ["bench", "engine", "--preset", "tiny", "--requests", "6", "--min-len", "8", "--max-len", "24"]
    backends = ["torch_native", "flex_attention"]
    # triton first: its engine stops at start on a CPU, and costs the backends after it nothing.
    attention = ",".join(["triton", *backends])
    result = CliRunner().invoke(
        app, [*args, "--hf-batch", "2", "--floor-requests", "2", "--attention", attention, "--profile-steps", "3"]
    )

    assert result.exit_code == 1, result.output
    # stdout alone: transformers' progress bars and warnings go to stderr, interleaved in result.output.
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, result.output
    figures = json.loads(lines[-1])
    assert list(figures["failed"]) == ["triton"]
    assert "RELAYRL_ENGINE_ATTENTION_BACKEND=triton" in figures["failed"]["triton"]
    engines = figures["engines"]
    assert sorted(engines) == sorted(backends)
    for name, engine in engines.items():
        # Every token of the workload arrived through the stream.
        assert engine["output_tokens"] == figures["output_tokens"] > 0
        assert engine["output_tokens_per_s"] > 0
        assert 0 < engine["ttft_p50_s"] <= engine["ttft_p99_s"]
        assert 0 < engine["itl_p50_s"] <= engine["itl_p99_s"]
        assert 0 < engine["kv_blocks_used"] <= engine["kv_blocks_total"]
        assert engine["attention_backend"] == name and engine["sampling_backend"] == "pytorch"
        assert engine["peak_gpu_memory_gib"] is None and engine["cuda_graph"] is False
        if name == "torch_native":
            # The CPU default compiles nothing. (Eager flex_attention is traced by dynamo inside torch.)
            assert engine["compiled_graphs"] == 0 and engine["compile_s"] == 0.0
        # On CPU the pass runs on the host: reading a step's tokens back waits on no device.
        assert 0 <= engine["device_wait_share"] < 0.5
        assert set(engine["weight_update_pause_s"]) == {"from_disk", "from_tensor"}
        assert all(pause > 0 for pause in engine["weight_update_pause_s"].values())
        # --profile-steps: the decode steps of a full batch, profiled apart from the workload.
        profile = engine["profile"]
        assert profile["rows"] == 6 and profile["steps"] == 3 and profile["device"] == "cpu"
        assert profile["by_kind"]["matmul"] > 0 and profile["top"][0]["s"] > 0
        assert engine["ratio_vs_hf_generate"] == round(
            engine["output_tokens_per_s"] / figures["hf_generate"]["output_tokens_per_s"], 2
        )
    # transformers' continuous batching ran as the second floor, its cache sized to the workload (left to
    # itself it took 90 % of the host's free memory, 14.7 GB here, and a test worker beside it died of it).
    assert figures["generate_batch"]["output_tokens"] > 0, figures["generate_batch"]
    assert figures["engine"] == max(engines.values(), key=lambda engine: engine["output_tokens_per_s"])
    assert figures["weight_update_pause_s"] == figures["engine"]["weight_update_pause_s"]
    assert figures["ratio_vs_hf_generate"] == figures["engine"]["ratio_vs_hf_generate"] > 0
    floor = figures["generate_batch"]
    assert "output_tokens_per_s" in floor or "skipped" in floor or "error" in floor
    assert (figures["ratio_vs_generate_batch"] is None) == ("output_tokens_per_s" not in floor)


def test_a_workload_past_its_deadline_is_cut_and_rated_over_what_streamed(tiny_model_dir: Path, tmp_path: Path) -> None:
    work = Workload.nano_vllm(requests=24, min_len=200, max_len=400, vocab=250)
    with engine_process(tiny_model_dir, "cpu", {}, tmp_path / "engine.log") as url:
        figures = asyncio.run(stream_workload(url, work, deadline=time.monotonic(), min_window_s=1.0))

        def idle() -> bool:
            samples = read_samples(url)
            return samples["relayrl_engine_running_requests"] == samples["relayrl_engine_waiting_requests"] == 0

        # Aborted, not left running: the update pauses measured next, and the next engine, find it idle.
        wait_until(idle, 10, "the aborted workload to leave the engine")
    assert figures["cut_short"] and figures["finished_requests"] < len(work.prompts)
    assert 0 < figures["output_tokens"] < sum(work.output_lens)
    assert 1.0 <= figures["wall_s"] < 5.0
    assert figures["output_tokens_per_s"] == pytest.approx(figures["output_tokens"] / figures["wall_s"], rel=2e-3)
