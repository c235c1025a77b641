"""The built-in engine, as a real process, against SGLang's native API contract."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from commands.stack.progress import read_samples
from relayrl import http_client
from relayrl.net import free_port
from services.engine.client import EngineClient, SamplingParams
from tests.integration.rollout.conftest import EngineProcess, perturbed_weights
from tests.mappings import mapped_files
from tests.waiting import wait_until_async

torch.set_num_threads(1)


def reference_logprobs(model_dir: Path, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    """Log-probs of ``output`` from one plain forward pass over prompt + output, at the sampling temperature."""
    from relayrl.models.loading import load_causal_lm

    model = load_causal_lm(model_dir)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)
    return [float(logprobs[i, t]) for i, t in enumerate(output)]


def logprobs_with(model_dir: Path, weights_dir: Path, prompt: list[int], output: list[int]) -> list[float]:
    """Log-probs of ``output`` at temperature 1 from ``model_dir``'s model holding the weights of
    ``weights_dir`` (what the engine serves after updating from it)."""
    from safetensors.torch import load_file

    from relayrl.models.loading import load_causal_lm

    model = load_causal_lm(model_dir)
    model.load_state_dict(load_file(str(weights_dir / "model.safetensors")), strict=False)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
    return [float(torch.log_softmax(logits[i], -1)[t]) for i, t in enumerate(output)]


async def _info(engine: EngineProcess) -> dict:
    async with EngineClient(engine.url) as client:
        return await client.model_info()


async def test_generate_response_has_sglang_fields_and_types(engine: EngineProcess) -> None:
    async with http_client.async_client(base_url=engine.url) as http:
        reply = await http.post(
            "/generate",
            json={
                "input_ids": [5, 6, 7],
                "sampling_params": {"max_new_tokens": 4, "temperature": 0.8},
                "return_logprob": True,
            },
        )
    assert reply.status_code == 200
    body = reply.json()
    assert isinstance(body, dict)
    assert isinstance(body["text"], str)
    assert all(isinstance(t, int) for t in body["output_ids"]) and 1 <= len(body["output_ids"]) <= 4
    meta = body["meta_info"]
    assert isinstance(meta["id"], str) and meta["id"]
    assert meta["finish_reason"]["type"] in ("stop", "length")
    if meta["finish_reason"]["type"] == "length":
        assert meta["finish_reason"]["length"] == 4
    assert meta["prompt_tokens"] == 3
    assert meta["completion_tokens"] == len(body["output_ids"])
    assert isinstance(meta["weight_version"], str)
    rows = meta["output_token_logprobs"]
    assert len(rows) == len(body["output_ids"])
    for (logprob, token_id, text), out_id in zip(rows, body["output_ids"], strict=True):
        assert isinstance(logprob, float) and logprob <= 0
        assert token_id == out_id
        assert text is None


async def test_logprobs_equal_a_plain_forward_pass_under_batching(engine: EngineProcess, tiny_model_dir: Path) -> None:
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19]]
    temperature = 0.7
    async with EngineClient(engine.url) as client:
        params = SamplingParams(max_new_tokens=12, temperature=temperature, ignore_eos=True)
        results = await asyncio.gather(*(client.generate(p, params) for p in prompts))
    for prompt, (out,) in zip(prompts, results, strict=True):
        expected = reference_logprobs(tiny_model_dir, prompt, out.output_ids, temperature)
        assert out.logprobs == pytest.approx(expected, abs=1e-4)


async def test_concurrent_requests_share_forward_passes(engine: EngineProcess) -> None:
    before = await _info(engine)
    requests, tokens = 6, 12
    async with EngineClient(engine.url) as client:
        params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
        await asyncio.gather(*(client.generate([20 + i, 21, 22], params) for i in range(requests)))
    after = await _info(engine)
    decode_passes = after["num_decode_forward_passes"] - before["num_decode_forward_passes"]
    # One request at a time would need requests × (tokens − 1) decode passes.
    assert decode_passes < requests * (tokens - 1) / 2
    assert after["max_decode_batch_size"] >= 3


async def test_n_greater_than_one_returns_n_samples(engine: EngineProcess) -> None:
    async with EngineClient(engine.url) as client:
        outs = await client.generate([5, 6, 7], SamplingParams(max_new_tokens=6, n=4, ignore_eos=True))
    assert len(outs) == 4
    assert len({o.rid for o in outs}) == 4
    assert all(len(o.output_ids) == 6 and len(o.logprobs) == 6 for o in outs)
    # Four independent samples of a random model are not all the same.
    assert len({tuple(o.output_ids) for o in outs}) > 1


async def _wait_generating(client: EngineClient, at_least: int) -> None:
    start = (await client.model_info())["generated_tokens"]

    async def generated() -> bool:
        return (await client.model_info())["generated_tokens"] >= start + at_least

    await wait_until_async(generated, poll_s=0.01, what=f"{at_least} tokens generated")


async def _wait_waiting(client: EngineClient, at_least: int) -> None:
    async def waiting() -> bool:
        return (await client.model_info())["num_waiting_requests"] >= at_least

    await wait_until_async(waiting, poll_s=0.01, what=f"{at_least} requests waiting")


async def test_pause_abort_returns_partial_output_and_holds_new_requests(engine: EngineProcess) -> None:
    async with EngineClient(engine.url) as client:
        long = SamplingParams(max_new_tokens=400, ignore_eos=True)
        running = asyncio.create_task(client.generate([5, 6], long))
        await _wait_generating(client, 5)
        await client.pause_generation("abort")
        (aborted,) = await asyncio.wait_for(running, 10)
        assert aborted.finish_reason == "abort"
        assert 0 < len(aborted.output_ids) < 400
        assert len(aborted.logprobs) == len(aborted.output_ids)
        held = asyncio.create_task(client.generate([5, 6], SamplingParams(max_new_tokens=3, ignore_eos=True)))
        await asyncio.sleep(0.3)  # what is under test: nothing comes back while paused
        assert not held.done()
        await client.continue_generation()
        (out,) = await asyncio.wait_for(held, 10)
        assert out.finish_reason == "length"


async def test_sigterm_ends_requests_a_pause_holds_and_the_engine_exits(
    start_engine: Callable[..., EngineProcess],
) -> None:
    engine = start_engine()
    async with EngineClient(engine.url) as client:
        await client.pause_generation("abort")
        held = asyncio.create_task(client.generate([5, 6], SamplingParams(max_new_tokens=3, ignore_eos=True)))
        await _wait_waiting(client, 1)
        assert engine.process is not None
        engine.process.send_signal(signal.SIGTERM)
        # Before, uvicorn's drain waited for the held request for ever (the stack SIGKILLed it after 15 s).
        (out,) = await asyncio.wait_for(held, 5)
        assert out.finish_reason == "abort" and out.output_ids == []
        assert await asyncio.to_thread(engine.process.wait, 5) == 0


@pytest.mark.parametrize("mode", ["retract", "in_place"])
async def test_pause_retract_and_in_place_resume_where_they_stopped(engine: EngineProcess, mode: str) -> None:
    async with EngineClient(engine.url) as client:
        running = asyncio.create_task(client.generate([5, 6], SamplingParams(max_new_tokens=150, ignore_eos=True)))
        await _wait_generating(client, 5)
        await client.pause_generation(mode)  # type: ignore[arg-type]
        frozen = (await client.model_info())["generated_tokens"]
        await asyncio.sleep(0.3)  # what is under test: no token is generated while paused
        assert (await client.model_info())["generated_tokens"] == frozen
        assert not running.done()
        await client.continue_generation()
        (out,) = await asyncio.wait_for(running, 20)
    assert out.finish_reason == "length"
    assert len(out.output_ids) == 150


async def test_update_weights_from_disk_sets_version_and_changes_logprobs(
    engine: EngineProcess, tiny_model_dir: Path, tmp_path: Path
) -> None:
    new_dir = perturbed_weights(tiny_model_dir, tmp_path / "v7")
    async with EngineClient(engine.url) as client:
        bad = await client.update_weights_from_disk(str(tmp_path / "missing"), weight_version=99)
        assert not bad.success
        assert (await client.model_info())["weight_version"] != "99"
        result = await client.update_weights_from_disk(str(new_dir), weight_version=7)
        assert result.success, result.message
        assert (await client.model_info())["weight_version"] == "7"
        (out,) = await client.generate([5, 6, 7], SamplingParams(max_new_tokens=5, temperature=1.0, ignore_eos=True))
        assert out.weight_version == "7"
        assert out.token_versions() == ["7"] * 5
        # Restore the original weights for the other tests of this module.
        assert (await client.update_weights_from_disk(str(tiny_model_dir), weight_version=8)).success
    expected = logprobs_with(tiny_model_dir, new_dir, [5, 6, 7], out.output_ids)
    assert out.logprobs == pytest.approx(expected, abs=1e-4)


async def test_a_conversations_next_turn_is_prefilled_from_its_new_tokens_until_the_weights_change(
    engine: EngineProcess, tiny_model_dir: Path
) -> None:
    first = list(range(5, 45))
    params = {"max_new_tokens": 6, "temperature": 1.0, "ignore_eos": True}
    async with http_client.async_client(base_url=engine.url) as http:

        async def generate(ids: list[int]) -> dict:
            reply = await http.post(
                "/generate", json={"input_ids": ids, "sampling_params": params, "return_logprob": True}
            )
            assert reply.status_code == 200, reply.text
            return reply.json()

        turn1 = await generate(first)
        second = first + turn1["output_ids"] + [60, 61, 62]  # the answer, then an observation
        turn2 = await generate(second)
        async with EngineClient(engine.url) as client:
            info = await client.model_info()
            assert (await client.update_weights_from_disk(str(tiny_model_dir), weight_version=9)).success
        again = await generate(second)
        async with EngineClient(engine.url) as client:
            assert await client.flush_cache()
        flushed = await generate(second)
    assert turn1["meta_info"]["cached_tokens"] == 0
    # Turn 1 fed its prompt and every sampled token but the last; turn 2 starts from those.
    assert turn2["meta_info"]["cached_tokens"] == len(first) + len(turn1["output_ids"]) - 1
    assert info["cached_prompt_tokens"] >= turn2["meta_info"]["cached_tokens"]
    expected = reference_logprobs(tiny_model_dir, second, turn2["output_ids"], 1.0)
    assert [row[0] for row in turn2["meta_info"]["output_token_logprobs"]] == pytest.approx(expected, abs=1e-4)
    # Keys and values of the previous weights answer no prompt after an update, even of the same weights.
    assert again["meta_info"]["cached_tokens"] == 0
    assert flushed["meta_info"]["cached_tokens"] == 0  # nor after /flush_cache


async def test_a_sequence_generated_across_a_weight_update_is_not_cached(
    engine: EngineProcess, tiny_model_dir: Path
) -> None:
    prompt = list(range(70, 100))
    # 1000 tokens take ~2 s alone, longer on a loaded machine than httpx's default 5 s read timeout.
    async with http_client.async_client(base_url=engine.url, timeout=60) as http, EngineClient(engine.url) as client:
        params = {"max_new_tokens": 1000, "temperature": 1.0, "ignore_eos": True}
        running = asyncio.create_task(http.post("/generate", json={"input_ids": prompt, "sampling_params": params}))
        await wait_until_async(lambda: _generated(engine), 10, "the generation to start")
        # In place: the sequence keeps its keys and values and goes on under the new version.
        assert (await client.update_weights_from_disk(str(tiny_model_dir), weight_version=11)).success
        first = (await running).json()
        assert len({span["version"] for span in first["meta_info"]["weight_versions"]}) == 2
        params = {"max_new_tokens": 2, "temperature": 1.0}
        reply = await http.post(
            "/generate", json={"input_ids": prompt + first["output_ids"], "sampling_params": params}
        )
    # Its keys and values mix two versions' weights: the next turn is prefilled afresh.
    assert reply.json()["meta_info"]["cached_tokens"] == 0


async def _generated(engine: EngineProcess) -> bool:
    return (await _info(engine))["num_running_requests"] > 0


async def test_versions_under_the_shared_weights_dir_are_served_from_their_files(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shm"
    monkeypatch.setenv("RELAYRL_ENGINE_SHARED_WEIGHTS_DIR", str(shared))
    served = EngineProcess(tiny_model_dir, free_port()).start()
    assert served.process is not None
    v1 = perturbed_weights(tiny_model_dir, shared / "v1", 1.5)
    v2 = perturbed_weights(tiny_model_dir, shared / "v2", 0.5)
    try:
        async with EngineClient(served.url) as client:
            assert (await client.update_weights_from_disk(str(v1), weight_version=1)).success
            assert str(v1 / "model.safetensors") in mapped_files(served.process.pid)
            assert (await client.update_weights_from_disk(str(v2), weight_version=2)).success
            maps = mapped_files(served.process.pid)
            # Serving v2 from its file, and done with v1's: the replica may now reuse that file.
            assert str(v2 / "model.safetensors") in maps and str(v1 / "model.safetensors") not in maps
            params = SamplingParams(max_new_tokens=5, temperature=1.0, ignore_eos=True)
            (out,) = await client.generate([5, 6, 7], params)
    finally:
        served.stop()
    expected = logprobs_with(tiny_model_dir, v2, [5, 6, 7], out.output_ids)
    assert out.weight_version == "2" and out.logprobs == pytest.approx(expected, abs=1e-4)


async def test_the_engine_times_each_pause_of_generation(engine: EngineProcess, tiny_model_dir: Path) -> None:
    family = "relayrl_engine_generation_paused_seconds"

    def paused() -> tuple[float, float]:
        samples = read_samples(engine.url)
        return samples[f"{family}_count"], samples[f"{family}_sum"]

    async with EngineClient(engine.url) as client:
        count, total = await asyncio.to_thread(paused)
        # An update sent without a pause holds generation while the scheduler installs it: once.
        update = await client.update_weights_from_disk(str(tiny_model_dir), weight_version=11, abort_all_requests=True)
        assert update.success, update.message
        after_update = await asyncio.to_thread(paused)
        assert after_update[0] == count + 1 and after_update[1] > total
        # Under a pause, one observation from the pause to its continue, which holds the update.
        await client.pause_generation("abort")
        started = time.perf_counter()
        assert (await client.update_weights_from_disk(str(tiny_model_dir), weight_version=12)).success
        update_s = time.perf_counter() - started
        await client.continue_generation()
        final = await asyncio.to_thread(paused)
    assert final[0] == after_update[0] + 1
    assert final[1] - after_update[1] > update_s


async def test_update_weights_from_distributed_over_gloo(engine: EngineProcess, tiny_model_dir: Path) -> None:
    import torch.distributed as dist

    from relayrl.models.loading import load_causal_lm

    state = {k: v * 0.5 for k, v in load_causal_lm(tiny_model_dir).state_dict().items() if k != "lm_head.weight"}
    port = free_port()
    joined = threading.Thread(
        target=dist.init_process_group,
        kwargs={"backend": "gloo", "init_method": f"tcp://127.0.0.1:{port}", "world_size": 2, "rank": 0},
    )
    async with EngineClient(engine.url) as client:
        joined.start()
        init = await client.init_weights_update_group("127.0.0.1", port, 1, 2, "wug", backend="gloo")
        await asyncio.to_thread(joined.join)
        assert init.success, init.message
        try:
            names = list(state)
            update = asyncio.create_task(
                client.update_weights_from_distributed(
                    names,
                    [str(state[n].dtype).removeprefix("torch.") for n in names],
                    [list(state[n].shape) for n in names],
                    group_name="wug",
                    weight_version=11,
                )
            )

            def send() -> None:
                for name in names:
                    dist.broadcast(state[name].contiguous(), src=0)

            await asyncio.to_thread(send)
            result = await update
            assert result.success, result.message
            assert (await client.model_info())["weight_version"] == "11"
            assert (await client.destroy_weights_update_group("wug")).success
        finally:
            dist.destroy_process_group()
        assert (await client.update_weights_from_disk(str(tiny_model_dir), weight_version=12)).success


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": [5, 999999], "sampling_params": {"max_new_tokens": 2}},
        {"sampling_params": {"max_new_tokens": 2}},
        {"input_ids": [5], "sampling_params": {"top_p": 0}},
        {"input_ids": [5], "sampling_params": {"max_new_tokens": "many"}},
        {"input_ids": "not tokens"},
    ],
)
async def test_bad_generate_requests_get_4xx(engine: EngineProcess, body: dict) -> None:
    async with http_client.async_client(base_url=engine.url) as http:
        reply = await http.post("/generate", json=body)
        assert 400 <= reply.status_code < 500
        assert (await http.get("/health")).status_code == 200
        bad_mode = await http.post("/pause_generation", json={"mode": "sideways"})
        assert 400 <= bad_mode.status_code < 500


async def test_a_profile_of_n_forward_passes_writes_sglangs_trace_and_where_the_time_went(
    engine: EngineProcess, tmp_path: Path
) -> None:
    import gzip
    import json

    async with http_client.async_client(base_url=engine.url) as http:
        started = await http.post("/start_profile", json={"output_dir": str(tmp_path), "num_steps": 3})
        assert started.status_code == 200 and started.text == "Start profiling.\n"
        again = await http.post("/start_profile", json={"output_dir": str(tmp_path)})
        assert again.status_code == 400 and "already in progress" in again.text
        params = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
        assert (await http.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": params})).is_success

        # Three forward passes in, the profile stops by itself and writes its files.
        summary_path = await wait_until_async(
            lambda: next(tmp_path.glob("*-TP-0.summary.json"), None), what="the profile's summary"
        )
        summary = json.loads(summary_path.read_text())
        info = await _info(engine)
        assert summary["device"] == info["device"].split(":")[0]
        assert summary["by_kind"]["matmul"] > 0 and summary["top"][0]["s"] > 0
        trace = summary_path.with_name(summary_path.name.replace(".summary.json", ".trace.json.gz"))
        assert json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]

        stopped = await http.post("/stop_profile")
        assert stopped.status_code == 400 and "not in progress" in stopped.text
        unknown = await http.post("/start_profile", json={"activities": ["CPU", "RPD"]})
        assert unknown.status_code == 400 and "RPD" in unknown.text


async def test_stop_profile_ends_a_profile_started_without_a_step_count(engine: EngineProcess, tmp_path: Path) -> None:
    async with http_client.async_client(base_url=engine.url) as http:
        assert (await http.post("/start_profile", json={"output_dir": str(tmp_path), "activities": ["CPU"]})).is_success
        params = {"max_new_tokens": 2, "temperature": 0.0}
        assert (await http.post("/generate", json={"input_ids": [5], "sampling_params": params})).is_success
        stopped = await http.post("/stop_profile")
        assert stopped.status_code == 200 and stopped.text == "Stop profiling. This will take some time.\n"
    assert len(list(tmp_path.glob("*-TP-0.summary.json"))) == 1
