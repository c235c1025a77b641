"""The rollout's OpenAI-compatible endpoint driven by the real ``openai`` client: a real rollout
replica and HTTP server, the real engine process and a real queue service over redis.

The tiny untrained model never writes a ``<tool_call>`` by itself, so tool calls come from a
named ``tool_choice``, which opens the call in the assistant turn and lets the model write the
arguments, or from a copy of the tiny model taught (``taught_model.py``) to finish a ``required``
call with valid JSON and then answer the tool's result; the parsing of a model-written block is
tested in tests/unit/rollout/test_openai_chat.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi import Depends
from pydantic import SecretStr

from relayrl import http_client
from relayrl.http_app import bearer_auth, create_http_app
from relayrl.models.loading import load_tokenizer
from relayrl.net import free_port
from relayrl.serving import start_http_server
from services.engine.client import EngineClient, GenerateOutput, SamplingParams
from services.queue.client import QueueClient
from services.queue.config import QueueSettings
from services.queue.server import QueueServer, start_queue_server
from services.rollout.config import RolloutSettings
from services.rollout.control import ReplicaControl
from services.rollout.openai_api import CONVERSATION_HEADER, OpenAIEndpoint, openai_router
from services.rollout.rewards import RewardRunner, resolve_reward
from services.rollout.server import openai_endpoint, start_rollout
from tests.integration.rollout.conftest import EngineProcess, queue_overrides
from tests.integration.rollout.replica_harness import pull_groups, running_replica, sample_value
from tests.integration.rollout.taught_model import teach
from tests.waiting import wait_until_async

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
FORCE_CALCULATOR = {"type": "function", "function": {"name": "calculator"}}
QUESTION = [{"role": "user", "content": "what is 2+3?"}]


class RecordingEngine(EngineClient):
    """The real client, keeping each /generate's input ids and what the engine answered."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        self.calls: list[tuple[list[int], GenerateOutput]] = []

    async def generate(self, input_ids: Sequence[int], sampling_params: SamplingParams, **kwargs: Any):
        outputs = await super().generate(input_ids, sampling_params, **kwargs)
        self.calls += [(list(input_ids), out) for out in outputs]
        return outputs


@dataclass
class Served:
    client: openai.AsyncOpenAI
    endpoint: OpenAIEndpoint
    engine: RecordingEngine
    base_url: str
    queue_address: str

    def value(self, name: str, **labels: str) -> float:
        registry = self.endpoint.metrics.registry.registry
        return registry.get_sample_value(f"relayrl_rollout_{name}", labels) or 0.0


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_tokenizer(tiny_model_dir)


@pytest.fixture
async def queue(redis_server, run_id: str) -> AsyncIterator[QueueServer]:
    server = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id)))
    yield server
    await server.stop()


@contextlib.asynccontextmanager
async def served(engine: EngineProcess, queue: QueueServer, **overrides: Any) -> AsyncIterator[Served]:
    """A replica with the endpoint on its own HTTP server; the endpoint's engine client records calls."""
    values = {"engine_url": engine.url, "queue_address": queue.grpc_address, "max_new_tokens": 8, **overrides}
    settings = RolloutSettings(**values)
    rewards = RewardRunner(resolve_reward(settings.reward_function), settings.reward_timeout_s)
    async with (
        running_replica(engine.url, queue.grpc_address, **overrides) as replica,
        QueueClient(queue.grpc_address) as pushes,
        RecordingEngine(engine.url) as recording,
    ):
        await wait_until_async(replica.state.ready, what="engine ready")
        endpoint = openai_endpoint(settings, replica, recording, pushes, rewards)
        app = create_http_app("rollout", replica.metrics.registry, replica.state.ready, SecretStr(""))
        app.include_router(openai_router(endpoint), dependencies=[Depends(bearer_auth(SecretStr("")))])
        http = await start_http_server(app, "127.0.0.1", 0)
        base_url = f"http://127.0.0.1:{http.port}"
        client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        try:
            yield Served(client, endpoint, recording, base_url, queue.grpc_address)
        finally:
            await client.close()
            await http.stop()
            rewards.close()


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


async def test_a_chat_completion_and_the_served_model(
    engine: EngineProcess, queue: QueueServer, tokenizer: Any
) -> None:
    async with served(engine, queue) as s:
        models = await s.client.models.list()
        version = int(await s.engine.weight_version())
        completion = await s.client.chat.completions.create(
            model="any-name", messages=QUESTION, max_tokens=6, logprobs=True, temperature=0.7
        )
    (model,) = models.data
    assert model.id == engine.model_dir.name and model.model_extra["weight_version"] == version
    prompt = _ids(tokenizer, "<|im_start|>user\nwhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    ((input_ids, out),) = s.engine.calls
    assert input_ids == prompt, "the messages go through the chat template"
    assert completion.object == "chat.completion" and completion.model == engine.model_dir.name
    (choice,) = completion.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.message.content == tokenizer.decode(out.output_ids, skip_special_tokens=True)
    assert choice.finish_reason == ("length" if out.finish_reason == "length" else "stop")
    assert [t.logprob for t in choice.logprobs.content] == out.logprobs
    assert completion.usage.prompt_tokens == len(prompt)
    assert completion.usage.completion_tokens == len(out.output_ids)
    assert completion.usage.total_tokens == len(prompt) + len(out.output_ids)


async def test_n_choices_share_one_request(engine: EngineProcess, queue: QueueServer) -> None:
    async with served(engine, queue) as s:
        completion = await s.client.chat.completions.create(model="m", messages=QUESTION, n=3, max_tokens=5)
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert len(s.engine.calls) == 3 and len({tuple(c[0]) for c in s.engine.calls}) == 1
    assert completion.usage.completion_tokens == sum(len(out.output_ids) for _, out in s.engine.calls)


async def test_a_named_tool_choice_answers_in_openais_tool_call_shape(
    engine: EngineProcess, queue: QueueServer, tokenizer: Any
) -> None:
    async with served(engine, queue) as s:
        completion = await s.client.chat.completions.create(
            model="m", messages=QUESTION, tools=[CALCULATOR], tool_choice=FORCE_CALCULATOR, max_tokens=6
        )
    (choice,) = completion.choices
    (call,) = choice.message.tool_calls
    ((input_ids, _),) = s.engine.calls
    assert input_ids[-len(_prefill(tokenizer)) :] == _prefill(tokenizer), "the call is opened in the assistant turn"
    assert call.type == "function" and call.function.name == "calculator" and call.id.startswith("call_")
    assert isinstance(call.function.arguments, str) and call.function.arguments
    assert choice.message.content is None
    assert choice.finish_reason in ("stop", "length"), "a forced named call finishes 'stop', as OpenAI's does"


def _prefill(tokenizer: Any) -> list[int]:
    return _ids(tokenizer, '<tool_call>\n{"name": "calculator", "arguments": ')


async def _tool_conversation(s: Served, conversation_id: str, **metadata: Any) -> list[dict[str, Any]]:
    """Turn one (a forced calculator call) and turn two after the tool's answer; the history so far."""
    headers = {CONVERSATION_HEADER: conversation_id}
    first = await s.client.chat.completions.create(
        model="m",
        messages=QUESTION,
        tools=[CALCULATOR],
        tool_choice=FORCE_CALCULATOR,
        max_tokens=6,
        logprobs=True,
        extra_headers=headers,
        metadata=metadata or None,
    )
    call = first.choices[0].message.tool_calls[0]
    history = [*QUESTION, first.choices[0].message.model_dump(exclude_none=True)]
    history.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    second = await s.client.chat.completions.create(
        model="m", messages=history, tools=[CALCULATOR], max_tokens=5, extra_headers=headers
    )
    return [*history, second.choices[0].message.model_dump(exclude_none=True)]


async def test_a_tool_conversation_is_recorded_token_exactly_and_pushed_on_finish(
    engine: EngineProcess, queue: QueueServer, tokenizer: Any
) -> None:
    async with served(engine, queue) as s:
        await _tool_conversation(s, "conv-1")
        async with http_client.async_client(base_url=s.base_url) as http:
            finished = await http.post("/v1/conversations/conv-1/finish", json={"reward": 0.75})
        (sample,) = (await pull_groups(queue.grpc_address, 1))[0].samples

    assert finished.status_code == 200 and finished.json()["group_waiting_for"] == 0
    (prompt, first), (second_input, second) = s.engine.calls
    assert prompt == _ids(tokenizer, "<|im_start|>user\nwhat is 2+3?<|im_end|>\n<|im_start|>assistant\n") + _prefill(
        tokenizer
    )
    # Written out by hand for ChatML: the turn's missing close, the tool's answer, the assistant opening.
    close = "\n" if first.output_ids[-1] == tokenizer.eos_token_id else "<|im_end|>\n"
    observation = _ids(tokenizer, f"{close}<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")
    assert second_input == prompt + first.output_ids + observation, "turn two continues the exact ids, no re-tokenizing"
    assert sample.prompt_token_ids == prompt
    assert sample.response_token_ids == first.output_ids + observation + second.output_ids
    assert sample.loss_mask == [1] * len(first.output_ids) + [0] * len(observation) + [1] * len(second.output_ids)
    assert sample.behavior_logprobs == first.logprobs + [0.0] * len(observation) + second.logprobs
    assert sample.turn_ends == [len(first.output_ids), len(sample.response_token_ids)]
    assert sample.reward == 0.75


async def test_conversations_sharing_a_group_id_are_pushed_as_one_scored_group(
    engine: EngineProcess, queue: QueueServer, tokenizer: Any
) -> None:
    async with served(engine, queue, reward_function="exact") as s:
        answers = []
        for name in ("a", "b"):
            completion = await s.client.chat.completions.create(
                model="m",
                messages=QUESTION,
                max_tokens=4,
                metadata={"conversation_id": name, "group_id": "g", "group_size": "2"},
            )
            answers.append(completion.choices[0].message.content)
        async with http_client.async_client(base_url=s.base_url) as http:
            first = await http.post("/v1/conversations/a/finish", json={"reward": 0.0})
            # Scored by the rollout's reward function on the last turn: exact match with itself is 1.
            second = await http.post(
                "/v1/conversations/b/finish", json={"score": True, "data_source": "d", "ground_truth": answers[1]}
            )
        (group,) = await pull_groups(queue.grpc_address, 1)
    assert first.json()["group_waiting_for"] == 1 and second.json()["group_waiting_for"] == 0
    assert sorted(s.reward for s in group.samples) == [0.0, 1.0]
    assert all(not s.loss_mask and not s.turn_ends for s in group.samples), "one turn keeps the single-turn encoding"
    assert group.data_source == "d"


async def test_a_history_that_differs_from_the_record_gets_409(engine: EngineProcess, queue: QueueServer) -> None:
    async with served(engine, queue) as s:
        history = await _tool_conversation(s, "conv-2")
        headers = {CONVERSATION_HEADER: "conv-2"}
        edited = json.loads(json.dumps(history))
        edited[1]["tool_calls"][0]["function"]["arguments"] = '{"expression": "edited"}'
        edited.append({"role": "user", "content": "and now?"})
        with pytest.raises(openai.ConflictError, match="message 1 \\(assistant\\) differs"):
            await s.client.chat.completions.create(
                model="m", messages=edited, tools=[CALCULATOR], extra_headers=headers
            )
        with pytest.raises(openai.ConflictError, match="adds none"):
            await s.client.chat.completions.create(
                model="m", messages=history, tools=[CALCULATOR], extra_headers=headers
            )
        with pytest.raises(openai.ConflictError, match="tools differ"):
            await s.client.chat.completions.create(model="m", messages=edited, extra_headers=headers)
        calls = len(s.engine.calls)
    assert calls == 2, "a refused request never reaches the engine"


async def test_bad_input_gets_400_naming_the_field(engine: EngineProcess, queue: QueueServer) -> None:
    async with served(engine, queue) as s:
        with pytest.raises(openai.BadRequestError, match="stream"):
            await s.client.chat.completions.create(model="m", messages=QUESTION, stream=True)
        with pytest.raises(openai.BadRequestError, match="temperature"):
            await s.client.chat.completions.create(model="m", messages=QUESTION, temperature=7)
        with pytest.raises(openai.BadRequestError, match="tool_choice names 'nope'"):
            await s.client.chat.completions.create(
                model="m",
                messages=QUESTION,
                tools=[CALCULATOR],
                tool_choice={"type": "function", "function": {"name": "nope"}},
            )
        with pytest.raises(openai.BadRequestError, match="n must be 1 in a recorded conversation") as recorded_n:
            await s.client.chat.completions.create(
                model="m", messages=QUESTION, n=2, extra_headers={CONVERSATION_HEADER: "c"}
            )
        async with http_client.async_client(base_url=s.base_url) as http:
            neither = await http.post("/v1/conversations/c/finish", json={})
            unknown = await http.post("/v1/conversations/nobody/finish", json={"reward": 1})
    assert recorded_n.value.param == "n"
    assert neither.status_code == 400 and "either a reward or score" in neither.json()["error"]["message"]
    assert unknown.status_code == 404
    assert s.engine.calls == []


async def test_an_idle_conversation_is_abandoned_counted_and_never_pushed(
    engine: EngineProcess, queue: QueueServer
) -> None:
    async with served(engine, queue, openai_conversation_idle_timeout_s=0.3) as s:
        sweeps = asyncio.create_task(s.endpoint.conversations.run_sweeps())
        await s.client.chat.completions.create(
            model="m", messages=QUESTION, max_tokens=3, extra_headers={CONVERSATION_HEADER: "idle"}
        )
        await wait_until_async(lambda: s.value("openai_conversations_total", outcome="abandoned") == 1)
        sweeps.cancel()
        async with http_client.async_client(base_url=s.base_url) as http:
            late = await http.post("/v1/conversations/idle/finish", json={"reward": 1})
        with pytest.raises(openai.ConflictError, match="abandoned"):
            await s.client.chat.completions.create(
                model="m", messages=QUESTION, extra_headers={CONVERSATION_HEADER: "idle"}
            )
        async with QueueClient(queue.grpc_address) as client:
            stats = await client.stats()
    assert late.status_code == 409 and "abandoned" in late.json()["error"]["message"]
    assert s.value("openai_groups_total", outcome="empty") == 1
    assert stats.total_produced == 0


async def test_the_rollout_service_serves_the_endpoint_behind_its_token(
    engine: EngineProcess, queue: QueueServer, tiny_model_dir: Path
) -> None:
    settings = RolloutSettings(
        engine_url=engine.url,
        queue_address=queue.grpc_address,
        engine_check_interval_s=0.1,
        max_new_tokens=4,
        api_token=SecretStr("sesame"),
    )
    running = await start_rollout(settings)
    try:
        await wait_until_async(running.replica.state.ready, what="engine ready")
        base_url = f"http://127.0.0.1:{running.servers.http.port}/v1"
        async with openai.AsyncOpenAI(base_url=base_url, api_key="sesame", max_retries=0) as client:
            completion = await client.chat.completions.create(model="m", messages=QUESTION)
        async with openai.AsyncOpenAI(base_url=base_url, api_key="wrong", max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError):
                await client.models.list()
    finally:
        await running.stop()
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert sample_value(running.replica, "generated_tokens_total") == completion.usage.completion_tokens


async def test_a_paused_replica_answers_503_with_retry_after_at_once_and_serves_again_on_resume(
    engine: EngineProcess, queue: QueueServer
) -> None:
    async with served(engine, queue, retry_after_s=3) as s:
        control = ReplicaControl(s.endpoint.state, s.engine)
        await control.pause("abort")
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as refused:
            await s.client.chat.completions.create(model="m", messages=QUESTION, max_tokens=4)
        answered_s = time.monotonic() - started
        await control.resume()
        completion = await s.client.chat.completions.create(model="m", messages=QUESTION, max_tokens=4)
    assert answered_s < 2.0, "a paused replica answers at once, it does not hold the request"
    assert refused.value.status_code == 503 and refused.value.response.headers["Retry-After"] == "3"
    assert "paused" in refused.value.message
    assert completion.choices[0].finish_reason in ("stop", "length")


async def test_a_request_in_flight_when_the_replica_pauses_is_answered_503_after_pause_wait_s(
    engine: EngineProcess, queue: QueueServer
) -> None:
    async with served(engine, queue, pause_wait_s=0.5, max_new_tokens=1500) as s:
        control = ReplicaControl(s.endpoint.state, s.engine)
        request = asyncio.create_task(
            s.client.chat.completions.create(
                model="m", messages=QUESTION, max_tokens=1500, extra_headers={CONVERSATION_HEADER: "paused"}
            )
        )
        await wait_until_async(lambda: s.endpoint.state.status().in_flight > 0 or request.done(), what="in flight")
        assert not request.done(), "the generation must still run when the pause comes"
        await control.pause("abort")
        paused_at = time.monotonic()
        with pytest.raises(openai.APIStatusError) as refused:
            await request
        answered_s = time.monotonic() - paused_at
        await control.resume()
        # The failed first turn left no record: the same conversation id starts afresh.
        again = await s.client.chat.completions.create(
            model="m", messages=QUESTION, max_tokens=3, extra_headers={CONVERSATION_HEADER: "paused"}
        )
    assert refused.value.status_code == 503 and "Retry-After" in refused.value.response.headers
    assert "pause_wait_s" in refused.value.message
    assert answered_s < 3.0, f"answered {answered_s:.1f}s after the pause; pause_wait_s is 0.5"
    assert again.choices[0].message.role == "assistant"


# The taught model's lessons: finish the call ``tool_choice: required`` opens, then answer the result.
CALL_JSON = '{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>'
ANSWER = "The answer is 5."


def _tool_prompt(tokenizer: Any) -> list[int]:
    text = tokenizer.apply_chat_template(QUESTION, tools=[CALCULATOR], tokenize=False, add_generation_prompt=True)
    return _ids(tokenizer, text) + _ids(tokenizer, "<tool_call>\n")


def _tool_observation(tokenizer: Any) -> list[int]:
    # ChatML by hand: the close the model did not write, the tool's answer, the assistant opening.
    return _ids(tokenizer, "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def taught_engine(tiny_model_dir: Path, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    first = _tool_prompt(tokenizer)
    second = first + _ids(tokenizer, CALL_JSON) + _tool_observation(tokenizer)
    model = teach(
        tiny_model_dir, tmp_path_factory.mktemp("taught"), [(first, CALL_JSON), (second, ANSWER + "<|im_end|>")]
    )
    engine = EngineProcess(model, free_port()).start()
    yield engine
    engine.stop()


async def test_a_required_tool_call_and_its_result_continue_the_conversation_token_exactly(
    taught_engine: EngineProcess, queue: QueueServer, tokenizer: Any
) -> None:
    headers = {CONVERSATION_HEADER: "calc"}
    async with served(taught_engine, queue, max_new_tokens=128) as s:
        first = await s.client.chat.completions.create(
            model="m",
            messages=QUESTION,
            tools=[CALCULATOR],
            tool_choice="required",
            temperature=0,
            extra_headers=headers,
        )
        message = first.choices[0].message
        (call,) = message.tool_calls
        history = [*QUESTION, message.model_dump(exclude_none=True)]
        history.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
        second = await s.client.chat.completions.create(
            model="m", messages=history, tools=[CALCULATOR], temperature=0, extra_headers=headers
        )
        async with http_client.async_client(base_url=s.base_url) as http:
            await http.post("/v1/conversations/calc/finish", json={"reward": 1.0})
        (sample,) = (await pull_groups(queue.grpc_address, 1))[0].samples

    assert first.choices[0].finish_reason == "tool_calls" and message.content is None
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "2+3"}
    assert second.choices[0].message.content == ANSWER and second.choices[0].finish_reason == "stop"
    (prompt, out1), (second_input, out2) = s.engine.calls
    assert prompt == _tool_prompt(tokenizer), "the turn is opened with <tool_call> after the tools' prompt"
    observation = _tool_observation(tokenizer)
    assert second_input == prompt + out1.output_ids + observation
    # The opening is in the prompt (mask 0): only what the model sampled is trained on.
    assert sample.prompt_token_ids == prompt
    assert sample.response_token_ids == out1.output_ids + observation + out2.output_ids
    assert sample.loss_mask == [1] * len(out1.output_ids) + [0] * len(observation) + [1] * len(out2.output_ids)
    assert sample.behavior_logprobs == out1.logprobs + [0.0] * len(observation) + out2.logprobs
