"""One multi-turn episode: generate → parse → tools or interaction → observation → generate again.

The episode ends when the model answers without a tool call (and no interaction keeps it
going), when the interaction ends it, after ``max_turns`` model turns, or when the token budget
has no room for another observation and model token; that reason (``answer``, ``interaction``,
``max_turns``, ``token_budget``), the episode's turns and each tool call's outcome and run time are
counted in the replica's metrics. Everything after the prompt is one
response: each turn's ids exactly as the engine returned them (loss mask 1, their log-probs and
versions), then each observation's ids (loss mask 0, log-prob 0.0, the version of the model token
before it). A turn is generated with :func:`~services.rollout.generation.continue_sample`, so an
abort by a weight update mid-turn resumes (or restarts that turn) like any single-turn sample.
Between turns the episode holds no engine request.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from services.engine.client import EngineClient, SamplingParams
from services.rollout.agent.execution import ToolExecutor, ToolOutcome
from services.rollout.agent.interactions import pick_interaction
from services.rollout.agent.parser import ToolCall, parse_tool_calls
from services.rollout.agent.rendering import ObservationRenderer
from services.rollout.generation import Gate, GenerationError, SampleResult, continue_sample
from services.rollout.metrics import RolloutMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EpisodeLimits:
    max_turns: int
    # 0: a turn may use all of the episode's remaining budget.
    max_tokens_per_turn: int
    max_parallel_calls: int


@dataclass
class EpisodeEnv:
    """What every episode of a replica shares."""

    tools: dict[str, Any]
    interactions: dict[str, Any]
    executor: ToolExecutor
    renderer: ObservationRenderer
    limits: EpisodeLimits
    # None: nothing is counted (an episode run outside a replica).
    metrics: RolloutMetrics | None = None

    def count_calls(self, outcomes: list[ToolOutcome]) -> None:
        if self.metrics is None:
            return
        for outcome in outcomes:
            self.metrics.tool_calls.labels(tool=outcome.tool, outcome=outcome.outcome).inc()
            if outcome.seconds is not None:
                self.metrics.tool_latency.labels(tool=outcome.tool).observe(outcome.seconds)

    def count_episode(self, reason: str, turns: int) -> None:
        if self.metrics is not None:
            self.metrics.episodes.labels(reason=reason).inc()
            self.metrics.episode_turns.observe(turns)


@dataclass
class _Observation:
    messages: list[dict[str, str]]
    reward: float = 0.0


@dataclass
class Episode:
    """``sampling.max_new_tokens`` is the episode's budget: every token after the prompt counts."""

    env: EpisodeEnv
    engine: EngineClient
    prompt_ids: list[int]
    sampling: SamplingParams
    mode: str
    held_version: Callable[[], int]
    rid: str
    extra_info: dict[str, Any]
    # Called with +1 / -1 around each engine request (the replica's in-flight count).
    engine_busy: Callable[[int], None] = lambda delta: None
    # Awaited before each engine submission (holds it while the replica is paused).
    gate: Gate | None = None
    result: SampleResult = field(default_factory=SampleResult)
    messages: list[dict[str, str]] = field(default_factory=list)
    _instances: dict[str, str] = field(default_factory=dict)
    _interaction: Any = None
    _interaction_id: str = ""
    _turn_rewards: list[float] = field(default_factory=list)

    async def run(self) -> SampleResult:
        await self._open()
        try:
            reason = await self._turns()
        finally:
            await self._close()
        self.env.count_episode(reason, len(self.result.turn_ends))
        if any(self._turn_rewards):
            self.result.token_rewards = [0.0] * len(self.result.output_ids)
            for end, reward in zip(self.result.turn_ends, self._turn_rewards, strict=True):
                self.result.token_rewards[end - 1] += reward
        return self.result

    async def _turns(self) -> str:
        """Runs the turns; returns why the episode ended."""
        for turn in range(self.env.limits.max_turns):
            turn_result = await self._generate_turn(turn)
            self._add_model_turn(turn_result)
            if turn_result.finish_reason == "length" and self._remaining() <= 0:
                return "token_budget"
            if not turn_result.output_ids:
                return "answer"
            observation = await self._observe(turn_result)
            if observation is None:
                return "interaction" if self._interaction is not None else "answer"
            if turn + 1 == self.env.limits.max_turns:
                break
            ids = self.env.renderer.observation_ids(observation.messages, turn_result.output_ids)
            if len(ids) >= self._remaining():
                self.result.finish_reason = "length"  # no room for the observation and one more model token
                return "token_budget"
            self._add_observation(observation.messages, ids)
        return "max_turns"

    def _remaining(self) -> int:
        return self.sampling.max_new_tokens - len(self.result.output_ids)

    async def _generate_turn(self, turn: int) -> SampleResult:
        budget = self._remaining()
        if self.env.limits.max_tokens_per_turn:
            budget = min(budget, self.env.limits.max_tokens_per_turn)
        params = replace(self.sampling, max_new_tokens=budget, n=1)
        self.engine_busy(1)
        try:
            return await continue_sample(
                self.engine,
                self.prompt_ids + self.result.output_ids,
                params,
                self.mode,
                self.held_version(),
                f"{self.rid}-t{turn}",
                SampleResult(),
                self.gate,
            )
        finally:
            self.engine_busy(-1)

    def _add_model_turn(self, turn: SampleResult) -> None:
        r = self.result
        r.output_ids += turn.output_ids
        r.logprobs += turn.logprobs
        r.versions += turn.versions
        r.loss_mask += [1] * len(turn.output_ids)
        r.turn_ends.append(len(r.output_ids))
        r.text += turn.text
        r.solution_text = turn.text
        # "length" is kept for an episode whose budget ran out; a turn cut by the per-turn cap ended normally.
        cut_by_turn_cap = turn.finish_reason == "length" and self._remaining() > 0
        r.finish_reason = "stop" if cut_by_turn_cap else turn.finish_reason
        r.engine_s += turn.engine_s
        r.resubmits += turn.resubmits
        self.messages.append({"role": "assistant", "content": turn.text})
        self._turn_rewards.append(0.0)

    def _add_observation(self, messages: list[dict[str, str]], ids: list[int]) -> None:
        r = self.result
        r.output_ids += ids
        r.logprobs += [0.0] * len(ids)
        r.versions += [r.versions[-1]] * len(ids)
        r.loss_mask += [0] * len(ids)
        r.text += self.env.renderer.decode(ids)
        self.messages += messages

    async def _observe(self, turn: SampleResult) -> _Observation | None:
        """The answer to a model turn: its tools' results, else the interaction's reply; None ends the episode."""
        parsed = parse_tool_calls(turn.text, self.env.tools.keys())
        if parsed.has_calls:
            observation = await self._run_tools(parsed.calls[: self.env.limits.max_parallel_calls])
        elif self._interaction is not None:
            observation = await self._interact()
        else:
            return None
        if observation is not None:
            self._turn_rewards[-1] += observation.reward
        return observation

    async def _run_tools(self, calls: list) -> _Observation:
        tools_kwargs = self.extra_info.get("tools_kwargs") or {}
        for call in calls:
            if isinstance(call, ToolCall) and call.name not in self._instances:
                self._instances[call.name] = await self._create_tool(call.name, tools_kwargs)
        outcomes = await self.env.executor.run_all(calls, self.env.tools, self._instances, tools_kwargs)
        self.env.count_calls(outcomes)
        return _Observation([{"role": "tool", "content": o.text} for o in outcomes], sum(o.reward for o in outcomes))

    async def _create_tool(self, name: str, tools_kwargs: dict[str, Any]) -> str:
        create_kwargs = (tools_kwargs.get(name) or {}).get("create_kwargs") or {}
        created = await self.env.executor.bounded(
            f"creating tool {name!r}", self.env.tools[name].create(uuid.uuid4().hex, **create_kwargs)
        )
        # Newer verl returns (instance_id, response) from create().
        return created[0] if isinstance(created, tuple) else created

    async def _interact(self) -> _Observation | None:
        kwargs = self.extra_info.get("interaction_kwargs") or {}
        try:
            done, reply, score, _ = await self.env.executor.bounded(
                "interaction", self._interaction.generate_response(self._interaction_id, self.messages, **kwargs)
            )
        except (TimeoutError, TypeError, ValueError) as exc:
            raise GenerationError(f"interaction failed: {exc!r}") from exc
        self._turn_rewards[-1] += float(score or 0.0)
        if done:
            return None
        return _Observation([{"role": "user", "content": str(reply)}])

    async def _open(self) -> None:
        kwargs = self.extra_info.get("interaction_kwargs") or {}
        try:
            self._interaction = pick_interaction(self.env.interactions, kwargs)
        except ValueError as exc:
            raise GenerationError(str(exc)) from exc
        if self._interaction is not None:
            self._interaction_id = await self.env.executor.bounded(
                "interaction start", self._interaction.start_interaction(uuid.uuid4().hex, **kwargs)
            )

    async def _close(self) -> None:
        """Collects tool rewards and releases every tool instance and the interaction, whatever happened."""
        tools_kwargs = self.extra_info.get("tools_kwargs") or {}
        for name, instance in self._instances.items():
            tool, kwargs = self.env.tools[name], tools_kwargs.get(name) or {}
            reward = await _quietly(tool.calc_reward(instance, **(kwargs.get("calc_reward_kwargs") or {})))
            self.result.extra[f"tool/{name}/reward"] = float(reward or 0.0)
            await _quietly(tool.release(instance, **(kwargs.get("release_kwargs") or {})))
        if self._interaction is not None:
            score = await _quietly(self._interaction.calculate_score(self._interaction_id))
            self.result.extra["interaction/score"] = float(score or 0.0)
            await _quietly(self._interaction.finalize_interaction(self._interaction_id))
        self.result.extra["episode/turns"] = float(len(self.result.turn_ends))


async def _quietly(call: Awaitable[Any]) -> Any:
    """A clean-up call whose failure is logged: it must not lose an episode that is already generated."""
    try:
        return await call
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("tool or interaction clean-up failed: %r", exc)
        return None
