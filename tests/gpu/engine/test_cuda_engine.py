"""The built-in engine on CUDA (``RELAYRL_ENGINE_DEVICE=cuda``, CUDA graphs on), as a real process
behind SGLang's native API, on the ``small`` preset:

- greedy output equals Hugging Face ``generate`` token for token (float32, so the two differ only
  by kernel rounding, which a random model's top-two logit gap exceeds);
- after a weight update through CUDA IPC handles (SGLang's ``update_weights_from_tensor`` with one
  flattened bucket per handle, sent from this process as a trainer on the same GPU) and from
  host buffers (``update_weights_from_disk``), the next tokens are exactly those of an engine
  started on the new weights;
- versions written into the trainer's two slots (``share_weights_by_handle``) load through their
  CUDA IPC handles, the same memory rewritten at the third version included;
- abort and pause under load leave no KV block held once the prefix cache is flushed;
- requests of every shape class compile nothing that the engine's start did not.

Run with ``make test-gpu`` (or ``scripts/gpu-checks/engine.sh``); skipped without a GPU.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from relayrl import http_client
from relayrl.net import free_port
from services.engine.launch import launch_engine
from services.engine.tensor_updates import flattened_bucket, serialize
from tests.integration.rollout.conftest import EngineProcess

pytestmark = pytest.mark.gpu

PROMPTS = [[(17 * i + 5 * t) % 250 + 3 for t in range(9 + 7 * i)] for i in range(6)]
NEW_TOKENS = 24
GREEDY = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
# Few graph sizes keep capture short; the batches here (6 prompts) replay the size-8 graph.
SETTINGS = {
    "RELAYRL_ENGINE_DEVICE": "cuda",
    "RELAYRL_ENGINE_DTYPE": "float32",
    "RELAYRL_ENGINE_CUDA_GRAPH_MAX_BS": "16",
    # A cache of its own size (1.5 GiB for `small`), not mem_fraction_static's share of the card: a
    # test runs a second engine beside the module's, which would find no room left for its cache.
    "RELAYRL_ENGINE_MAX_TOTAL_TOKENS": "262144",
}


def cuda_engine(model_dir: Path, **settings: str) -> EngineProcess:
    """An engine process of ``model_dir`` on the GPU, with these tests' settings and ``settings``."""
    return EngineProcess(model_dir, free_port(), {**SETTINGS, **settings}).start(timeout_s=300)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relayrl.models.tiny import init_tiny, preset_spec

    return init_tiny(tmp_path_factory.mktemp("small"), preset_spec("small"))


@pytest.fixture(scope="module")
def new_dir(small_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``small`` with other weights (another seed), as a whole model directory."""
    from relayrl.models.tiny import init_tiny, preset_spec

    directory = tmp_path_factory.mktemp("small-new")
    return init_tiny(directory, preset_spec("small", seed=1))


@pytest.fixture(scope="module")
def engine(small_dir: Path) -> Iterator[EngineProcess]:
    running = cuda_engine(small_dir)
    yield running
    running.stop()


async def greedy(url: str) -> list[list[int]]:
    async with http_client.async_client(base_url=url, timeout=120) as http:
        response = await http.post("/generate", json={"input_ids": PROMPTS, "sampling_params": GREEDY})
        response.raise_for_status()
        return [body["output_ids"] for body in response.json()]


async def greedy_of_an_engine_started_on(model_dir: Path) -> list[list[int]]:
    reference = cuda_engine(model_dir)
    try:
        return await greedy(reference.url)
    finally:
        reference.stop()


def hf_greedy(model_dir: Path) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="sdpa")
    model = model.to("cuda").eval()
    outputs = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt], device="cuda")
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
            outputs.append(out[0, len(prompt) :].tolist())
    return outputs


async def model_info(url: str) -> dict:
    async with http_client.async_client(base_url=url, timeout=30) as http:
        return (await http.get("/get_model_info")).json()


async def test_greedy_output_equals_hf_generate_with_cuda_graphs(engine: EngineProcess, small_dir: Path) -> None:
    got = await greedy(engine.url)
    info = await model_info(engine.url)

    assert got == hf_greedy(small_dir)
    assert info["device"].startswith("cuda") and info["attention_backend"] == "flex_attention"
    assert info["cuda_graph_batch_sizes"] == [1, 2, 4, 8, 16] and info["cuda_graph_replays"] >= NEW_TOKENS - 1


def flattened_bucket_on_gpu(model_dir: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return flattened_bucket({name: t.to("cuda") for name, t in load_file(str(model_dir / "model.safetensors")).items()})


async def test_serving_compiles_nothing_that_the_start_did_not(engine: EngineProcess) -> None:
    before = (await model_info(engine.url))["compiled_graphs"]
    long_prompt = [(7 * t) % 250 + 3 for t in range(300)]  # several flex query blocks
    async with http_client.async_client(base_url=engine.url, timeout=120) as http:
        # One row and many; short prompts and long; decode batches inside the graphs' sizes and past them.
        for prompts in ([PROMPTS[0]], [long_prompt], PROMPTS, [long_prompt, *PROMPTS], PROMPTS * 4):
            body = {"input_ids": prompts, "sampling_params": GREEDY}
            assert (await http.post("/generate", json=body)).status_code == 200

    info = await model_info(engine.url)
    assert before > 0 and info["compiled_graphs"] == before
    assert info["max_decode_batch_size"] > int(SETTINGS["RELAYRL_ENGINE_CUDA_GRAPH_MAX_BS"])


async def test_after_each_weight_route_the_tokens_are_an_engine_started_on_the_new_weights(
    engine: EngineProcess, small_dir: Path, new_dir: Path, tmp_path: Path
) -> None:
    expected = await greedy_of_an_engine_started_on(new_dir)
    before = await greedy(engine.url)
    assert before != expected

    bucket = flattened_bucket_on_gpu(new_dir)  # held by this process (the trainer) until the engine answers
    async with http_client.async_client(base_url=engine.url, timeout=120) as http:
        body = {
            "serialized_named_tensors": [serialize(bucket)],
            "load_format": "flattened_bucket",
            "weight_version": "1",
        }
        response = await http.post("/update_weights_from_tensor", json=body)
        assert response.status_code == 200, response.text
        assert await greedy(engine.url) == expected

        # Back to the old weights, then the new ones again from host buffers (a file, as paramsync leaves one).
        old = {
            "serialized_named_tensors": [serialize(flattened_bucket_on_gpu(small_dir))],
            "load_format": "flattened_bucket",
        }
        assert (await http.post("/update_weights_from_tensor", json=old)).status_code == 200
        assert await greedy(engine.url) == before
        host = tmp_path / "host"
        host.mkdir()
        shutil.copy(new_dir / "model.safetensors", host / "model.safetensors")
        response = await http.post("/update_weights_from_disk", json={"model_path": str(host), "weight_version": "2"})
        assert response.status_code == 200, response.text
        assert await greedy(engine.url) == expected
        # Leave the module's engine on its own weights.
        assert (await http.post("/update_weights_from_disk", json={"model_path": str(small_dir)})).status_code == 200


async def test_the_trainers_slots_reach_the_engine_by_cuda_ipc_version_after_version(
    engine: EngineProcess, small_dir: Path, new_dir: Path
) -> None:
    """``share_weights_by_handle``'s sender: versions written into the trainer's two slots (the
    same GPU memory again at the third) and loaded through their handles, one call per bucket."""
    from types import SimpleNamespace

    from safetensors.torch import load_file

    from services.paramsync.tensors import as_pairs, open_specs
    from services.trainer.weight_handles import HandleSlots

    expected = await greedy_of_an_engine_started_on(new_dir)
    before = await greedy(engine.url)
    slots = HandleSlots(torch.device("cuda"))
    async with http_client.async_client(base_url=engine.url, timeout=120) as http:
        for version, (model_dir, want) in enumerate(
            [(new_dir, expected), (small_dir, before), (new_dir, expected), (small_dir, before)], start=1
        ):
            pairs = as_pairs({n: t.to("cuda") for n, t in load_file(str(model_dir / "model.safetensors")).items()})
            # Every replica holds the version before: each slot is free when its turn comes.
            claimed = slots.claim(version, open_specs(pairs), SimpleNamespace(latest_version=version - 1, replicas=[]))
            assert claimed is not None
            writer, handles = claimed
            writer.write([t for _, t in pairs])
            # The trainer's version is announced only once its bytes reached paramsync, which their
            # host copies, queued after these, precede: here nothing else orders the engine's read.
            torch.cuda.synchronize()
            for i, payload in enumerate(handles.buckets):
                last = i == len(handles.buckets) - 1
                body = {"serialized_named_tensors": [payload], "load_format": handles.load_format}
                body |= {"weight_version": str(version)} if last else {}
                response = await http.post("/update_weights_from_tensor", json=body)
                assert response.status_code == 200 and response.json()["success"], response.text
            assert await greedy(engine.url) == want, f"version {version}"


@pytest.mark.parametrize("mode", ["abort", "retract"])
async def test_abort_and_pause_under_load_leave_no_kv_block_held(engine: EngineProcess, mode: str) -> None:
    params = {"temperature": 1.0, "max_new_tokens": 2000, "ignore_eos": True}
    async with http_client.async_client(base_url=engine.url, timeout=300) as http:
        load = [
            asyncio.create_task(http.post("/generate", json={"input_ids": prompt, "sampling_params": params}))
            for prompt in PROMPTS * 4
        ]

        async def generating() -> bool:
            return (await model_info(engine.url))["generated_tokens"] > 200

        for _ in range(600):
            if await generating():
                break
            await asyncio.sleep(0.05)
        await http.post("/pause_generation", json={"mode": mode})
        if mode == "retract":
            # Retracted sequences give their blocks back, and none has finished into the prefix cache yet.
            assert (await model_info(engine.url))["kv_used_blocks"] == 0
            await http.post("/continue_generation", json={})
            await http.post("/abort_request", json={"abort_all": True})
        else:
            await http.post("/continue_generation", json={})
        bodies = [response.json() for response in await asyncio.gather(*load)]
        assert all(body["meta_info"]["finish_reason"]["type"] == "abort" for body in bodies)
        assert (await http.post("/flush_cache")).status_code == 200
    assert (await model_info(engine.url))["kv_used_blocks"] == 0


def test_a_memory_fraction_with_no_room_for_the_kv_cache_stops_at_start_naming_it(small_dir: Path) -> None:
    port = free_port()
    # The cache sized by the fraction (max_total_tokens 0), as a user's engine sizes it.
    fraction = {"RELAYRL_ENGINE_MAX_TOTAL_TOKENS": "0", "RELAYRL_ENGINE_MEM_FRACTION_STATIC": "0.001"}
    process = launch_engine(small_dir, port, stderr=subprocess.PIPE, settings={**SETTINGS, **fraction})
    _, stderr = process.communicate(timeout=300)

    assert process.returncode == 2
    lines = [line for line in stderr.decode().splitlines() if "MEM_FRACTION_STATIC" in line]
    assert len(lines) == 1 and "leaves no room for the KV cache" in lines[0]
