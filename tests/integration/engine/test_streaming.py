"""``/generate`` with ``stream: true`` on the built-in engine (a real process), in SGLang's format:
server-sent ``data:`` events ending with ``data: [DONE]``, chunks cumulative by default and only
the new part with ``incremental_streaming_output``, a batch's chunks interleaved with their
``index``, the last chunk equal to the non-streamed answer, and a stream ended early (an abort, a
client gone) ending its request in the engine."""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from relayrl import http_client
from relayrl.net import free_port
from relayrl.subprocesses import stop_process
from services.engine.launch import launch_engine, wait_engine_healthy
from tests.waiting import wait_until_async

PROMPT = [5, 6, 7, 8, 9, 10, 11]
# Enough decode steps that the chunks cannot all find the client behind, even on a loaded machine.
NEW_TOKENS = 48
GREEDY = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


class Engine:
    def __init__(self, model_dir: Path, **settings: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = launch_engine(model_dir, port, stderr=subprocess.DEVNULL, settings=settings)
        wait_engine_healthy(self.process, self.url, timeout_s=180)


@pytest.fixture(scope="module")
def cumulative(tiny_model_dir: Path) -> Iterator[Engine]:
    engine = Engine(tiny_model_dir)
    yield engine
    stop_process(engine.process)


@pytest.fixture(scope="module")
def incremental(tiny_model_dir: Path) -> Iterator[Engine]:
    engine = Engine(
        tiny_model_dir, RELAYRL_ENGINE_INCREMENTAL_STREAMING_OUTPUT="true", RELAYRL_ENGINE_STREAM_INTERVAL="3"
    )
    yield engine
    stop_process(engine.process)


async def stream(url: str, body: dict[str, Any]) -> tuple[httpx.Response, list[bytes]]:
    """The response and its non-empty lines."""
    async with (
        http_client.async_client(base_url=url, timeout=60) as http,
        http.stream("POST", "/generate", json=body) as r,
    ):
        lines = [line.encode() async for line in r.aiter_lines() if line]
    return r, lines


def chunks_of(lines: list[bytes]) -> list[dict[str, Any]]:
    assert all(line.startswith(b"data: ") for line in lines), lines
    assert lines[-1] == b"data: [DONE]"
    return [json.loads(line[len(b"data: ") :]) for line in lines[:-1]]


async def unstreamed(url: str, body: dict[str, Any]) -> Any:
    async with http_client.async_client(base_url=url, timeout=60) as http:
        response = await http.post("/generate", json=body)
        response.raise_for_status()
        return response.json()


async def test_a_streamed_generate_sends_cumulative_chunks_and_ends_with_the_unstreamed_answer(
    cumulative: Engine,
) -> None:
    body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True}
    response, lines = await stream(cumulative.url, {**body, "stream": True})
    whole = await unstreamed(cumulative.url, body)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = chunks_of(lines)
    assert len(chunks) > 1, "the answer came in one piece"
    *running, last = chunks
    for earlier, later in itertools.pairwise(chunks):
        assert later["output_ids"][: len(earlier["output_ids"])] == earlier["output_ids"]
        assert later["text"].startswith(earlier["text"])
    for chunk in running:
        meta = chunk["meta_info"]
        assert set(chunk) == {"text", "output_ids", "meta_info"}
        assert meta["finish_reason"] is None and "e2e_latency" not in meta
        assert meta["completion_tokens"] == len(chunk["output_ids"]) == len(meta["output_token_logprobs"])
        assert meta["prompt_tokens"] == len(PROMPT) and meta["id"] == last["meta_info"]["id"]
    assert last["output_ids"] == whole["output_ids"] and last["text"] == whole["text"]
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": NEW_TOKENS}
    assert set(last["meta_info"]) == set(whole["meta_info"])
    assert [lp[1] for lp in last["meta_info"]["output_token_logprobs"]] == whole["output_ids"]


async def test_incremental_chunks_hold_only_what_is_new_every_stream_interval_tokens(incremental: Engine) -> None:
    body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True}
    _, lines = await stream(incremental.url, {**body, "stream": True})
    whole = await unstreamed(incremental.url, body)

    chunks = chunks_of(lines)
    assert [t for chunk in chunks for t in chunk["output_ids"]] == whole["output_ids"]
    assert "".join(chunk["text"] for chunk in chunks) == whole["text"]
    logprobs = [lp for chunk in chunks for lp in chunk["meta_info"]["output_token_logprobs"]]
    assert [lp[1] for lp in logprobs] == whole["output_ids"]
    assert all(chunk["meta_info"]["completion_tokens"] > 0 for chunk in chunks)
    # A chunk after tokens 1, 4, ..., 46 at most (fewer when one finds the client behind), then the last.
    assert 2 <= len(chunks) <= len(range(1, NEW_TOKENS, 3)) + 1


async def test_a_streamed_batch_interleaves_each_samples_chunks_with_its_index(cumulative: Engine) -> None:
    prompts = [PROMPT, [12, 13, 14]]
    params = {**GREEDY, "n": 2}
    _, lines = await stream(cumulative.url, {"input_ids": prompts, "sampling_params": params, "stream": True})
    whole = await unstreamed(cumulative.url, {"input_ids": prompts, "sampling_params": params})

    chunks = chunks_of(lines)
    assert {chunk["index"] for chunk in chunks} == {0, 1, 2, 3}
    last = {chunk["index"]: chunk for chunk in chunks if chunk["meta_info"]["finish_reason"] is not None}
    assert [last[i]["output_ids"] for i in range(4)] == [answer["output_ids"] for answer in whole]


async def test_an_abort_ends_the_stream_with_an_abort_chunk_and_done(cumulative: Engine) -> None:
    rid = "stream-to-abort"
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}, "rid": rid}
    async with (
        http_client.async_client(base_url=cumulative.url, timeout=60) as http,
        http.stream("POST", "/generate", json={**body, "stream": True}) as response,
    ):
        lines = []
        async for line in response.aiter_lines():
            if not line:
                continue
            lines.append(line.encode())
            if len(lines) == 1:
                assert (await http.post("/abort_request", json={"rid": rid})).status_code == 200
    chunks = chunks_of(lines)
    finish = chunks[-1]["meta_info"]["finish_reason"]
    assert finish["type"] == "abort"
    assert 0 < len(chunks[-1]["output_ids"]) < 1500


async def test_a_client_that_leaves_mid_stream_ends_its_request_in_the_engine(cumulative: Engine) -> None:
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}, "stream": True}
    async with http_client.async_client(base_url=cumulative.url, timeout=60) as http:
        before = (await http.get("/get_model_info")).json()["generated_tokens"]
        async with http.stream("POST", "/generate", json=body) as response:
            async for line in response.aiter_lines():
                if line:
                    break  # the first chunk; the connection closes as the block exits

        async def idle() -> bool:
            info = (await http.get("/get_model_info")).json()
            return info["num_running_requests"] == 0 and info["num_waiting_requests"] == 0

        await wait_until_async(idle, timeout_s=30, what="the engine to drop the left stream's request")
        after = (await http.get("/get_model_info")).json()["generated_tokens"]
    assert after - before < 1500, "the left request ran to its end"


async def test_a_bad_streamed_request_gets_sglangs_error_event(cumulative: Engine) -> None:
    body = {"input_ids": [5, 999999], "sampling_params": {"max_new_tokens": 2}, "stream": True}
    _, lines = await stream(cumulative.url, body)

    assert lines[-1] == b"data: [DONE]"
    error = json.loads(lines[0][len(b"data: ") :])
    assert "input_ids must be in" in error["error"]["message"]
