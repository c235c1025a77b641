"""Issue #47 on the GPU beyond the engine's own contract: the triton attention backend's greedy
output equals Hugging Face ``generate`` token for token with its decode steps replayed from CUDA
graphs; a streamed ``/generate`` from the CUDA engine carries exactly the unstreamed greedy
tokens; and ``bench engine`` (all three attention backends in one run), ``bench rollout`` and
``bench openai`` with ``--device cuda`` run their engine on the GPU (each reports the device its
engine answers from), briefly, on the ``tiny`` preset.

Run with ``make test-gpu`` (or ``scripts/gpu-checks/engine.sh``); skipped without a GPU.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commands.cli import app
from relayrl import http_client
from relayrl.net import free_port
from relayrl.subprocesses import stop_process
from services.engine.launch import launch_engine, wait_engine_healthy

pytestmark = pytest.mark.gpu

PROMPTS = [[(13 * i + 3 * t) % 250 + 3 for t in range(5 + 11 * i)] for i in range(5)]
GREEDY = {"temperature": 0.0, "max_new_tokens": 40, "ignore_eos": True}


SETTINGS = {
    "RELAYRL_ENGINE_DEVICE": "cuda",
    "RELAYRL_ENGINE_DTYPE": "float32",
    "RELAYRL_ENGINE_CUDA_GRAPH_MAX_BS": "16",
    # A cache of its own size (1.5 GiB for `small`), not mem_fraction_static's share of the card: a
    # test runs a second engine beside the module's, which would find no room left for its cache.
    "RELAYRL_ENGINE_MAX_TOTAL_TOKENS": "262144",
}


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relayrl.models.tiny import init_tiny, preset_spec

    return init_tiny(tmp_path_factory.mktemp("small"), preset_spec("small"))


def json_line(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, stdout
    return json.loads(lines[-1])


async def test_the_triton_backend_greedy_output_equals_hf_generate_with_cuda_graphs(small_dir: Path) -> None:
    from tests.gpu.engine.test_cuda_engine import cuda_engine, greedy, hf_greedy, model_info

    engine = cuda_engine(small_dir, RELAYRL_ENGINE_ATTENTION_BACKEND="triton")
    try:
        got = await greedy(engine.url)
        info = await model_info(engine.url)
    finally:
        engine.stop()

    assert got == hf_greedy(small_dir)
    assert info["attention_backend"] == "triton" and info["cuda_graph_replays"] > 0


async def test_streamed_chunks_from_the_cuda_engine_add_up_to_the_unstreamed_greedy_tokens(small_dir: Path) -> None:
    port = free_port()
    settings = {**SETTINGS, "RELAYRL_ENGINE_INCREMENTAL_STREAMING_OUTPUT": "true"}
    process = launch_engine(small_dir, port, stderr=subprocess.DEVNULL, settings=settings)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_engine_healthy(process, url, timeout_s=300)
        async with http_client.async_client(base_url=url, timeout=120) as http:
            whole = (await http.post("/generate", json={"input_ids": PROMPTS, "sampling_params": GREEDY})).json()
            body = {"input_ids": PROMPTS, "sampling_params": GREEDY, "stream": True}
            async with http.stream("POST", "/generate", json=body) as response:
                lines = [line async for line in response.aiter_lines() if line]
            info = (await http.get("/get_model_info")).json()
    finally:
        stop_process(process)

    assert lines[-1] == "data: [DONE]"
    streamed: dict[int, list[int]] = {}
    for line in lines[:-1]:
        chunk = json.loads(line.removeprefix("data: "))
        streamed.setdefault(chunk["index"], []).extend(chunk["output_ids"])
    assert [streamed[i] for i in range(len(PROMPTS))] == [answer["output_ids"] for answer in whole]
    assert info["cuda_graph_replays"] > 0


def test_bench_engine_on_cuda_measures_every_attention_backend_with_gpu_memory() -> None:
    args = ["bench", "engine", "--device", "cuda", "--preset", "tiny", "--requests", "8", "--min-len", "16"]
    options = ["--max-len", "64", "--floor-requests", "4", "--cuda-graph-max-bs", "8"]
    result = CliRunner().invoke(app, [*args, *options, "--attention", "flex_attention,torch_native,triton"])

    assert result.exit_code == 0, result.output
    figures = json_line(result.stdout)
    assert figures["gpu"] and sorted(figures["engines"]) == ["flex_attention", "torch_native", "triton"]
    assert figures["engines"]["flex_attention"]["cuda_graph"] is True
    assert figures["engines"]["triton"]["cuda_graph"] is True
    for engine in figures["engines"].values():
        assert engine["output_tokens"] == figures["output_tokens"]
        assert engine["peak_gpu_memory_gib"] > 0 and engine["ttft_p50_s"] > 0 and engine["itl_p50_s"] > 0
        # Steps ran, and each read its tokens back from the GPU: the share is measured, whichever side bounds it.
        assert 0 <= engine["device_wait_share"] <= 1
    assert figures["hf_generate"]["peak_gpu_memory_gib"] > 0


def test_bench_rollout_with_device_cuda_runs_its_engine_on_the_gpu() -> None:
    args = ["bench", "rollout", "--device", "cuda", "--prompts", "8", "--n", "2", "--max-new-tokens", "16"]
    result = CliRunner().invoke(app, [*args, "--inflight", "4", "--rounds", "1"])

    assert result.exit_code == 0, result.output
    figures = json_line(result.stdout)
    assert figures["engine_device"].startswith("cuda")
    assert figures["tokens_per_s"] > 0 and figures["direct_tokens_per_s"] > 0


def test_bench_openai_with_device_cuda_runs_its_engine_on_the_gpu() -> None:
    args = ["bench", "openai", "--device", "cuda", "--episodes", "4", "--turns", "2", "--max-tokens", "16"]
    result = CliRunner().invoke(app, [*args, "--concurrency", "4", "--rounds", "1"])

    assert result.exit_code == 0, result.output
    figures = json_line(result.stdout)
    assert figures["engine_device"].startswith("cuda")
    assert figures["openai_tokens"] > 0 and figures["native_tokens"] > 0
