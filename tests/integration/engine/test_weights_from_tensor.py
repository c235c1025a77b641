"""SGLang's ``/update_weights_from_tensor`` on the built-in engine, sent from another process in
SGLang's shape (``MultiprocessingSerializer``: ForkingPickler, base64): after the update the
engine answers exactly as an engine started on the new weights, in both load formats; payloads it
cannot open are refused with a 400 that says why, and the old weights keep serving."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import torch.multiprocessing
from safetensors.torch import load_file

from relayrl import http_client
from relayrl.net import free_port
from services.engine.tensor_updates import flattened_bucket, serialize
from tests.integration.rollout.conftest import EngineProcess, perturbed_weights

PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]
GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def new_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with visibly different weights, as a whole model directory."""
    directory = tmp_path_factory.mktemp("new-weights")
    shutil.copytree(tiny_model_dir, directory, dirs_exist_ok=True)
    return perturbed_weights(tiny_model_dir, directory)


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path, new_model_dir: Path) -> Iterator[tuple[EngineProcess, EngineProcess]]:
    updated = EngineProcess(tiny_model_dir, free_port()).start()
    reference = EngineProcess(new_model_dir, free_port()).start()
    yield updated, reference
    updated.stop()
    reference.stop()


async def greedy(http: httpx.AsyncClient) -> list[int]:
    response = await http.post("/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY})
    response.raise_for_status()
    return response.json()["output_ids"]


async def update(http: httpx.AsyncClient, payload: object, load_format: str | None, version: str) -> httpx.Response:
    body = {"serialized_named_tensors": [serialize(payload)], "load_format": load_format, "weight_version": version}
    return await http.post("/update_weights_from_tensor", json=body, timeout=60)


@pytest.mark.parametrize("load_format", ["flattened_bucket", None])
async def test_after_an_update_the_engine_answers_as_one_started_on_the_new_weights(
    engines: tuple[EngineProcess, EngineProcess],
    tiny_model_dir: Path,
    new_model_dir: Path,
    load_format: str | None,
    file_system_sharing: None,
) -> None:
    updated, reference = engines
    new = load_file(str(new_model_dir / "model.safetensors"))
    old = load_file(str(tiny_model_dir / "model.safetensors"))
    async with http_client.async_client(base_url=updated.url, timeout=60) as http:
        async with http_client.async_client(base_url=reference.url, timeout=60) as ref:
            expected = await greedy(ref)
        before = await greedy(http)
        assert before != expected, "the new weights must answer differently for this test to mean anything"

        payload = flattened_bucket(new) if load_format else list(new.items())
        response = await update(http, payload, load_format, "7")

        assert response.status_code == 200, response.text
        assert response.json()["success"] is True
        assert await greedy(http) == expected
        assert (await http.get("/get_weight_version")).json()["weight_version"] == "7"
        # Back to the original weights for the next case.
        assert (await update(http, flattened_bucket(old), "flattened_bucket", "8")).status_code == 200
        assert await greedy(http) == before


async def test_payloads_the_engine_cannot_open_are_refused_and_the_weights_stay(
    engines: tuple[EngineProcess, EngineProcess], new_model_dir: Path
) -> None:
    updated, _ = engines
    new = load_file(str(new_model_dir / "model.safetensors"))
    async with http_client.async_client(base_url=updated.url, timeout=60) as http:
        before = await greedy(http)
        # torch's default strategy shares CPU tensors by file descriptor, which only the sender's children can open.
        torch.multiprocessing.set_sharing_strategy("file_descriptor")
        by_descriptor = await update(http, list(new.items()), None, "9")
        not_a_payload = await http.post("/update_weights_from_tensor", json={"serialized_named_tensors": ["%%%"]})
        two_ranks = await http.post(
            "/update_weights_from_tensor", json={"serialized_named_tensors": [serialize([]), serialize([])]}
        )
        assert await greedy(http) == before

    assert by_descriptor.status_code == 400 and "file_system" in by_descriptor.json()["message"]
    assert not_a_payload.status_code == 400 and "not a serialized tensor payload" in not_a_payload.json()["message"]
    assert two_ranks.status_code == 400 and "exactly one" in two_ranks.json()["message"]
