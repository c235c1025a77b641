"""Tools and interactions loaded from verl-format YAML, and run with a concurrency limit and timeout."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from relayrl.tasks import make_rows
from relayrl.tasks.guess import GuessInteraction
from services.rollout.agent.execution import ToolExecutor
from services.rollout.agent.interactions import load_interactions, pick_interaction
from services.rollout.agent.parser import CallError, ToolCall
from services.rollout.agent.tools import BaseTool, load_tools


class AddTool(BaseTool):
    """Adds two numbers; ``offset`` comes from the row's execute_kwargs; rewards a correct call."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        return str(parameters["a"] + parameters["b"] + kwargs.get("offset", 0)), 0.5, {}


class GateTool(BaseTool):
    """Answers once its ``gate`` (set per test) opens: a tool as slow as the test wants."""

    gate: asyncio.Event

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        await self.gate.wait()
        return "opened", 0.0, {}


class BrokenTool(BaseTool):
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        raise RuntimeError("disk full")


TOOL_YAML = """
tools:
  - class_name: tests.unit.rollout.test_agent_tools.AddTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: add
        description: Adds a and b.
        parameters: {type: object, properties: {a: {type: integer}, b: {type: integer}}, required: [a, b]}
  - class_name: tests.unit.rollout.test_agent_tools:GateTool
    config: {}
    tool_schema: {type: function, function: {name: gate}}
  - class_name: tests.unit.rollout.test_agent_tools.BrokenTool
    config: {}
    tool_schema: {type: function, function: {name: broken}}
"""


@pytest.fixture
def tools(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "tools.yaml"
    path.write_text(TOOL_YAML)
    loaded = load_tools(path)
    loaded["gate"].gate = asyncio.Event()
    return loaded


def test_tools_load_by_import_path_with_their_schema(tools: dict[str, Any]) -> None:
    assert sorted(tools) == ["add", "broken", "gate"]
    assert isinstance(tools["add"], AddTool)
    assert tools["add"].config == {"type": "native"}
    assert tools["add"].tool_schema.function.parameters["required"] == ["a", "b"]


def test_a_bad_tool_config_names_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: tests.unit.rollout.test_agent_tools.Nope\n    tool_schema: {}\n")
    with pytest.raises(ValueError, match=r"tools\[0\]"):
        load_tools(path)


async def test_calls_run_with_the_rows_kwargs_and_failures_become_observations(tools: dict[str, Any]) -> None:
    executor = ToolExecutor(concurrency=4, timeout_s=5.0, max_response_chars=100)
    calls = [
        ToolCall("add", {"a": 2, "b": 3}),
        CallError("unknown tool 'x'", "unknown_tool"),
        ToolCall("broken", {}),
        CallError("arguments of 'add' must be a JSON object", tool="add"),
    ]
    instances = {"add": "i-add", "broken": "i-broken"}
    outcomes = await executor.run_all(calls, tools, instances, {"add": {"execute_kwargs": {"offset": 10}}})
    assert [(o.text, o.reward, o.error, o.outcome, o.tool) for o in outcomes] == [
        ("15", 0.5, False, "ok", "add"),
        ("Error: unknown tool 'x'", 0.0, True, "unknown_tool", ""),
        ("Error: RuntimeError('disk full')", 0.0, True, "error", "broken"),
        ("Error: arguments of 'add' must be a JSON object", 0.0, True, "malformed", "add"),
    ]
    ran = [o.seconds is not None for o in outcomes]
    assert ran == [True, False, True, False], "only calls that reached a tool have a run time"


async def test_a_tool_that_times_out_tells_the_model(tools: dict[str, Any]) -> None:
    executor = ToolExecutor(concurrency=4, timeout_s=0.2, max_response_chars=100)
    (outcome,) = await executor.run_all([ToolCall("gate", {})], tools, {"gate": "g"}, {})
    assert outcome.error and outcome.text == "Error: tool 'gate' timed out after 0.2s"
    assert outcome.outcome == "timeout" and outcome.seconds is not None and outcome.seconds >= 0.2


async def test_a_timed_out_call_is_timed_from_its_slot_even_when_the_loop_starts_it_late(
    tools: dict[str, Any],
) -> None:
    # A busy loop runs other callbacks between arming the timeout and the tool's first step (on
    # 3.11 wait_for starts the call as a task of its own); the latency histogram must still record
    # a timed-out call as lasting at least the timeout. The nested call_soon queues a 0.1 s stall
    # just behind the call's own first step, so it lands in exactly that gap.
    loop = asyncio.get_running_loop()
    executor = ToolExecutor(concurrency=4, timeout_s=0.2, max_response_chars=100)
    loop.call_soon(lambda: loop.call_soon(time.sleep, 0.1))
    (outcome,) = await executor.run_all([ToolCall("gate", {})], tools, {"gate": "g"}, {})
    assert outcome.outcome == "timeout" and outcome.seconds is not None and outcome.seconds >= 0.2


async def test_a_slow_tool_does_not_hold_other_calls(tools: dict[str, Any]) -> None:
    executor = ToolExecutor(concurrency=2, timeout_s=30.0, max_response_chars=100)
    slow = asyncio.create_task(executor.run_all([ToolCall("gate", {})], tools, {"gate": "g"}, {}))
    fast = await asyncio.wait_for(executor.run_all([ToolCall("add", {"a": 1, "b": 1})], tools, {"add": "a"}, {}), 5)
    assert fast[0].text == "2" and not slow.done()
    tools["gate"].gate.set()
    assert (await slow)[0].text == "opened"


async def test_the_concurrency_limit_queues_calls_beyond_it(tools: dict[str, Any]) -> None:
    executor = ToolExecutor(concurrency=1, timeout_s=30.0, max_response_chars=100)
    slow = asyncio.create_task(executor.run_all([ToolCall("gate", {})], tools, {"gate": "g"}, {}))
    queued = asyncio.create_task(executor.run_all([ToolCall("add", {"a": 1, "b": 1})], tools, {"add": "a"}, {}))
    await asyncio.wait({queued}, timeout=0.3)
    assert not queued.done(), "the only slot is held by the slow call"
    tools["gate"].gate.set()
    assert (await asyncio.wait_for(queued, 5))[0].text == "2"
    await slow


async def test_long_tool_answers_are_cut(tools: dict[str, Any]) -> None:
    executor = ToolExecutor(concurrency=1, timeout_s=5.0, max_response_chars=3)
    (outcome,) = await executor.run_all([ToolCall("add", {"a": 5000, "b": 1})], tools, {"add": "a"}, {})
    assert outcome.text == "500...(truncated)"


async def test_the_guess_interaction_answers_higher_lower_and_ends_the_game() -> None:
    # builtin:guess is the task's shipped config, as a recipe names it.
    interactions = load_interactions("builtin:guess")
    (row,) = make_rows("guess", 1, seed=1, difficulty=3)
    assert row["extra_info"]["interaction_kwargs"]["name"] == "guess"
    kwargs = {**row["extra_info"]["interaction_kwargs"], "secret": 3, "max_turns": 3}
    game = pick_interaction(interactions, kwargs)
    assert isinstance(game, GuessInteraction)

    async def answer(game_id: str, content: str) -> tuple[bool, str]:
        done, reply, _, _ = await game.generate_response(game_id, [{"role": "assistant", "content": content}], **kwargs)
        return done, reply

    lost = await game.start_interaction("g1", **kwargs)
    assert [await answer(lost, guess) for guess in ("5", "x", "2")] == [
        (False, "lower"),
        (False, "say a number"),
        (True, "no guesses left"),
    ]
    assert await game.calculate_score(lost) == 0.0
    won = await game.start_interaction("g2", **kwargs)
    assert [await answer(won, guess) for guess in ("1", "3")] == [(False, "higher"), (True, "correct")]
    assert await game.calculate_score(won) == 1.0
    assert pick_interaction(interactions, {}) is None, "a row without interaction_kwargs talks to no interaction"
