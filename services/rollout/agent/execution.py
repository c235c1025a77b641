"""Running an episode's tool calls: concurrently, under one replica-wide limit, each with a timeout.

A call that times out, raises, or returns something that is not verl's ``(text, reward, metrics)``
answers the model with an error message instead; nothing here ends an episode. A slow tool holds
only its own episode (and one slot of the limit), never the engine or other episodes. Each outcome
says how the call went (``ok``, ``malformed``, ``unknown_tool``, ``error``, ``timeout``: the
``outcome`` label of ``relayrl_rollout_tool_calls_total``) and how long the tool ran once it had
a slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Literal

from services.rollout.agent.parser import CallError, ToolCall

log = logging.getLogger(__name__)


Outcome = Literal["ok", "malformed", "unknown_tool", "error", "timeout"]


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What one call tells the model, the step reward it earned, and how the call went.

    ``tool`` is the configured tool the call named ("" when it named none); ``seconds`` is how long
    the tool ran (None when nothing ran: a malformed call or an unknown tool).
    """

    text: str
    reward: float = 0.0
    outcome: Outcome = "ok"
    tool: str = ""
    seconds: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> bool:
        return self.outcome != "ok"


class ToolExecutor:
    """Shared by every episode of a replica, so ``concurrency`` bounds the replica's tool calls."""

    def __init__(self, concurrency: int, timeout_s: float, max_response_chars: int) -> None:
        self._slots = asyncio.Semaphore(concurrency)
        self.timeout_s = timeout_s
        self.max_response_chars = max_response_chars

    async def bounded(self, what: str, call: Awaitable[Any], ran: Stopwatch | None = None) -> Any:
        """``call`` under the limit and the timeout; raises TimeoutError naming ``what``.

        ``ran`` is started once a slot is held and before the timeout is armed, so a call that
        timed out is never recorded as shorter than the timeout.
        """
        async with self._slots:
            started = time.perf_counter()
            try:
                return await asyncio.wait_for(call, self.timeout_s)
            except TimeoutError:
                raise TimeoutError(f"{what} timed out after {self.timeout_s:g}s") from None
            finally:
                if ran is not None:
                    ran.seconds = time.perf_counter() - started

    async def run_all(
        self, calls: list[ToolCall | CallError], tools: dict[str, Any], instances: dict[str, str], kwargs: dict
    ) -> list[ToolOutcome]:
        """One outcome per call, in order; ``instances`` maps tool names to this episode's instance ids."""
        return list(await asyncio.gather(*(self._run(call, tools, instances, kwargs) for call in calls)))

    async def _run(
        self, call: ToolCall | CallError, tools: dict[str, Any], instances: dict[str, str], kwargs: dict
    ) -> ToolOutcome:
        if isinstance(call, CallError):
            return ToolOutcome(f"Error: {call.message}", outcome=call.kind, tool=call.tool)
        tool = tools[call.name]
        execute_kwargs = (kwargs.get(call.name) or {}).get("execute_kwargs") or {}
        ran = Stopwatch()
        try:
            result = await self.bounded(
                f"tool {call.name!r}", tool.execute(instances[call.name], call.arguments, **execute_kwargs), ran
            )
            text, reward, metrics = _verl_result(result)
        except asyncio.CancelledError:
            raise
        except TimeoutError as exc:
            log.info("tool %s timed out", call.name)
            return ToolOutcome(f"Error: {exc}", outcome="timeout", tool=call.name, seconds=ran.seconds)
        except Exception as exc:  # a tool's bug is the model's observation, not the episode's end
            log.info("tool %s failed: %r", call.name, exc)
            return ToolOutcome(f"Error: {exc!r}", outcome="error", tool=call.name, seconds=ran.seconds)
        return ToolOutcome(self._truncate(text), reward, tool=call.name, seconds=ran.seconds, metrics=metrics)

    def _truncate(self, text: str) -> str:
        # verl's max_tool_response_length, cut on the right (its default truncate side).
        if len(text) <= self.max_response_chars:
            return text
        return text[: self.max_response_chars] + "...(truncated)"


@dataclass
class Stopwatch:
    """How long one call under :meth:`ToolExecutor.bounded` ran; None until it ended."""

    seconds: float | None = None


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
