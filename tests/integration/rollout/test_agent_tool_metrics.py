"""What an operator watches of tool use, read from a real rollout service's ``/metrics``: tool
calls by tool and outcome, tool run time, turns per episode and why episodes ended.

The engine serves a tiny model taught to answer one question with four Hermes calls (a good one,
malformed JSON, an unknown tool, a tool that outlives the timeout) and another with a plain
answer, so each outcome comes from text the engine really generated.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from relayrl import http_client
from relayrl.models.loading import load_tokenizer
from relayrl.net import free_port
from relayrl.schema import PromptSpec
from services.queue.client import QueueClient
from services.queue.config import QueueSettings
from services.queue.server import QueueServer, start_queue_server
from services.rollout.agent.tools import BaseTool
from services.rollout.config import RolloutSettings
from services.rollout.server import start_rollout
from tests.integration.rollout.conftest import EngineProcess, queue_overrides
from tests.integration.rollout.replica_harness import pull_groups
from tests.integration.rollout.taught_model import chat_prompt_ids, teach
from tests.waiting import wait_until_async

USE_TOOLS = "use the tools"
JUST_ANSWER = "just answer"
CALLS = (
    '<tool_call>{"name":"add","arguments":{"a":2,"b":3}}</tool_call>'
    '<tool_call>{"name":"add","arguments":x}</tool_call>'
    '<tool_call>{"name":"nope","arguments":{}}</tool_call>'
    '<tool_call>{"name":"sleep","arguments":{}}</tool_call><|im_end|>'
)
TIMEOUT_S = 0.3


class AddTool(BaseTool):
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        return str(parameters["a"] + parameters["b"]), 0.0, {}


class SleepTool(BaseTool):
    """Never answers: every call outlives the timeout."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        await asyncio.Event().wait()
        return "", 0.0, {}


TOOL_YAML = """
tools:
  - class_name: tests.integration.rollout.test_agent_tool_metrics.AddTool
    tool_schema: {type: function, function: {name: add}}
  - class_name: tests.integration.rollout.test_agent_tool_metrics.SleepTool
    tool_schema: {type: function, function: {name: sleep}}
"""


@pytest.fixture(scope="module")
def taught_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    tokenizer = load_tokenizer(tiny_model_dir)
    lessons = [(chat_prompt_ids(tokenizer, USE_TOOLS), CALLS), (chat_prompt_ids(tokenizer, JUST_ANSWER), "5<|im_end|>")]
    model = teach(tiny_model_dir, tmp_path_factory.mktemp("taught"), lessons)
    engine = EngineProcess(model, free_port()).start()
    yield engine
    engine.stop()


@pytest.fixture
async def queue(redis_server, run_id: str) -> AsyncIterator[QueueServer]:
    server = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id)))
    yield server
    await server.stop()


def _prompt(tokenizer: Any, name: str, question: str, **kwargs: Any) -> PromptSpec:
    ids = chat_prompt_ids(tokenizer, question)
    return PromptSpec(prompt_id=name, prompt_token_ids=ids, n_samples=1, data_source="d", ground_truth="5", **kwargs)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_tool_outcomes_latency_turns_and_end_reasons_reach_metrics(
    taught_engine: EngineProcess, queue: QueueServer, tmp_path: Path
) -> None:
    tools = tmp_path / "tools.yaml"
    tools.write_text(TOOL_YAML)
    settings = RolloutSettings(
        engine_url=taught_engine.url,
        queue_address=queue.grpc_address,
        engine_check_interval_s=0.1,
        lease_block_timeout_s=0.2,
        temperature=0.0,
        max_new_tokens=256,
        multi_turn_enable=True,
        multi_turn_max_assistant_turns=1,
        multi_turn_max_parallel_calls=4,
        multi_turn_tool_timeout_s=TIMEOUT_S,
        multi_turn_tool_config_path=str(tools),
    )
    tokenizer = load_tokenizer(taught_engine.model_dir)
    running = await start_rollout(settings)
    try:
        await wait_until_async(running.replica.state.ready, what="engine ready")
        async with QueueClient(queue.grpc_address) as client:
            await client.release(
                [
                    _prompt(tokenizer, "tools", USE_TOOLS),
                    _prompt(tokenizer, "answer", JUST_ANSWER),
                    # Cut inside its first call: the budget ends the episode before any tool runs.
                    _prompt(tokenizer, "budget", USE_TOOLS, max_new_tokens=10),
                ]
            )
        groups = await pull_groups(queue.grpc_address, 3)
        async with http_client.async_client() as http:
            scraped = await http.get(f"http://127.0.0.1:{running.servers.http.port}/metrics")
    finally:
        await running.stop()

    texts = {g.prompt_id: tokenizer.decode(g.samples[0].response_token_ids) for g in groups}
    assert texts == {"tools": CALLS, "answer": "5<|im_end|>", "budget": CALLS[:10]}, "the model wrote its lessons"
    metrics = _samples(scraped.text)

    def value(name: str, **labels: str) -> float:
        return metrics.get((f"relayrl_rollout_{name}", tuple(sorted(labels.items()))), 0.0)

    calls = {
        (labels["tool"], labels["outcome"]): v
        for (name, items), v in metrics.items()
        if name == "relayrl_rollout_tool_calls_total"
        for labels in [dict(items)]
    }
    assert calls == {("add", "ok"): 1, ("", "malformed"): 1, ("", "unknown_tool"): 1, ("sleep", "timeout"): 1}
    assert value("tool_latency_seconds_count", tool="add") == 1
    assert value("tool_latency_seconds_count", tool="sleep") == 1
    assert value("tool_latency_seconds_sum", tool="sleep") >= TIMEOUT_S, "a timed-out call ran until the timeout"
    assert value("tool_latency_seconds_sum", tool="add") < TIMEOUT_S
    assert value("tool_latency_seconds_count", tool="") == 0, "calls that reached no tool have no run time"
    assert value("episodes_total", reason="max_turns") == 1
    assert value("episodes_total", reason="answer") == 1
    assert value("episodes_total", reason="token_budget") == 1
    assert value("episode_turns_count") == 3 and value("episode_turns_sum") == 3
