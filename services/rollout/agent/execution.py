"""Running an episode's tool calls: concurrently, under one replica-wide limit, each with a timeout.

A call that times out, raises, or returns something that is not verl's ``(text, reward, metrics)``
answers the model with an error message instead; nothing here ends an episode. A slow tool holds
only its own episode (and one slot of the limit), never the engine or other episodes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from services.rollout.agent.parser import CallError, ToolCall

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What one call tells the model, the step reward it earned, and whether it failed."""

    text: str
    reward: float = 0.0
    error: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)


class ToolExecutor:
    """Shared by every episode of a replica, so ``concurrency`` bounds the replica's tool calls."""

    def __init__(self, concurrency: int, timeout_s: float, max_response_chars: int) -> None:
        self._slots = asyncio.Semaphore(concurrency)
        self.timeout_s = timeout_s
        self.max_response_chars = max_response_chars

    async def bounded(self, what: str, call: Awaitable[Any]) -> Any:
        """``call`` under the limit and the timeout; raises TimeoutError naming ``what``."""
        async with self._slots:
            try:
                return await asyncio.wait_for(call, self.timeout_s)
            except TimeoutError:
                raise TimeoutError(f"{what} timed out after {self.timeout_s:g}s") from None

    async def run_all(
        self, calls: list[ToolCall | CallError], tools: dict[str, Any], instances: dict[str, str], kwargs: dict
    ) -> list[ToolOutcome]:
        """One outcome per call, in order; ``instances`` maps tool names to this episode's instance ids."""
        return list(await asyncio.gather(*(self._run(call, tools, instances, kwargs) for call in calls)))

    async def _run(
        self, call: ToolCall | CallError, tools: dict[str, Any], instances: dict[str, str], kwargs: dict
    ) -> ToolOutcome:
        if isinstance(call, CallError):
            return ToolOutcome(f"Error: {call.message}", error=True)
        tool = tools[call.name]
        execute_kwargs = (kwargs.get(call.name) or {}).get("execute_kwargs") or {}
        try:
            result = await self.bounded(
                f"tool {call.name!r}", tool.execute(instances[call.name], call.arguments, **execute_kwargs)
            )
            text, reward, metrics = _verl_result(result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a tool's bug is the model's observation, not the episode's end
            log.info("tool %s failed: %r", call.name, exc)
            return ToolOutcome(f"Error: {exc}" if isinstance(exc, TimeoutError) else f"Error: {exc!r}", error=True)
        return ToolOutcome(self._truncate(text), reward, metrics=metrics)

    def _truncate(self, text: str) -> str:
        # verl's max_tool_response_length, cut on the right (its default truncate side).
        if len(text) <= self.max_response_chars:
            return text
        return text[: self.max_response_chars] + "...(truncated)"


def _verl_result(result: Any) -> tuple[str, float, dict[str, Any]]:
    """verl's ``(text | ToolResponse, reward, metrics)``; a bare string is text with no reward."""
    if isinstance(result, str):
        return result, 0.0, {}
    if not isinstance(result, tuple) or len(result) != 3:
        raise TypeError(f"execute() must return (text, reward, metrics), got {type(result).__name__}")
    response, reward, metrics = result
    text = response if isinstance(response, str) else getattr(response, "text", None)
    if not isinstance(text, str):
        raise TypeError(f"execute() returned {type(response).__name__} where text was expected")
    return text, float(reward or 0.0), dict(metrics or {})
