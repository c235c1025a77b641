"""The engine serves prompt + output past 2,048 tokens, and refuses a longer prompt as SGLang does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch

from relayrl import http_client
from relayrl.models.tiny import TinyModelSpec, init_tiny
from relayrl.net import free_port
from services.engine.client import EngineClient, SamplingParams
from tests.integration.rollout.conftest import EngineProcess
from tests.integration.rollout.test_engine import reference_logprobs

CONTEXT = 2304


@pytest.fixture(scope="module")
def long_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    # context_length is left at 0: the engine must take it from max_position_embeddings.
    model_dir = init_tiny(tmp_path_factory.mktemp("long-model"), TinyModelSpec(max_positions=CONTEXT))
    proc = EngineProcess(model_dir, free_port()).start()
    yield proc
    proc.stop()


async def test_generations_past_2048_tokens_keep_exact_logprobs(long_engine: EngineProcess) -> None:
    long_prompt, short_prompt = list(range(3, 51)), [7, 8, 9]
    async with EngineClient(long_engine.url) as client:
        assert (await client.model_info())["context_length"] == CONTEXT
        long_params = SamplingParams(max_new_tokens=2048, temperature=1.0, ignore_eos=True)
        short_params = SamplingParams(max_new_tokens=300, temperature=1.0, ignore_eos=True)
        # The short one joins and leaves the running batch while the long one decodes.
        (long_out,), (short_out,) = await asyncio.gather(
            client.generate(long_prompt, long_params), client.generate(short_prompt, short_params)
        )
    assert len(long_out.output_ids) == 2048 and len(long_prompt) + 2048 > 2048
    assert len(short_out.output_ids) == 300
    torch.set_num_threads(1)
    for prompt, out in ((long_prompt, long_out), (short_prompt, short_out)):
        expected = reference_logprobs(long_engine.model_dir, prompt, out.output_ids, 1.0)
        assert out.logprobs == pytest.approx(expected, abs=1e-4)


async def test_output_stops_at_the_context_length(long_engine: EngineProcess) -> None:
    prompt = [5] * (CONTEXT - 40)
    async with http_client.async_client(base_url=long_engine.url, timeout=60) as http:
        reply = await http.post(
            "/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}
        )
    assert reply.status_code == 200
    meta = reply.json()["meta_info"]
    assert meta["completion_tokens"] == 40
    assert meta["finish_reason"] == {"type": "length", "length": 40}


async def test_a_prompt_longer_than_the_context_gets_sglangs_error(long_engine: EngineProcess) -> None:
    async with http_client.async_client(base_url=long_engine.url, timeout=60) as http:
        reply = await http.post("/generate", json={"input_ids": [5] * (CONTEXT + 1)})
        assert reply.status_code == 400
        assert "longer than the model's context length" in reply.json()["error"]["message"]
        assert (await http.get("/health_generate")).status_code == 200
