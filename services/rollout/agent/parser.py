"""Hermes tool calls, the format of Qwen2.5 and verl: ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``.

Whatever the model wrote, parsing never raises: a call that cannot be run becomes a
:class:`CallError` whose message is shown to the model as the tool's answer, so the episode goes
on and the model can learn from its mistake.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
# Non-greedy, so two calls in one turn stay two; an unclosed last call is matched to the end.
_CALL = re.compile(re.escape(OPEN_TAG) + r"(.*?)(?:" + re.escape(CLOSE_TAG) + r"|$)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CallError:
    """A call the model wrote that cannot be run, and why (what the model is told).

    ``kind`` is ``malformed`` (not a JSON object with a name and object arguments) or
    ``unknown_tool``; ``tool`` is the configured tool it names, if any (a name the model made up is
    not kept: as a metric label it would grow without bound).
    """

    message: str
    kind: Literal["malformed", "unknown_tool"] = "malformed"
    tool: str = ""


@dataclass(frozen=True, slots=True)
class ParsedTurn:
    """The calls of one model turn, in the order written; empty when the turn answers without a tool."""

    calls: list[ToolCall | CallError] = field(default_factory=list)

    @property
    def has_calls(self) -> bool:
        return bool(self.calls)


def parse_tool_calls(text: str, known_tools: Collection[str]) -> ParsedTurn:
    """Every ``<tool_call>`` block of ``text``, checked against the names in ``known_tools``."""
    return ParsedTurn([_parse_one(body.strip(), known_tools) for body in _CALL.findall(text)])


def _parse_one(body: str, known_tools: Collection[str]) -> ToolCall | CallError:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        return CallError(f"tool call is not valid JSON ({exc.msg} at position {exc.pos})")
    if not isinstance(payload, dict):
        return CallError("tool call must be a JSON object with 'name' and 'arguments'")
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return CallError("tool call has no 'name'")
    if name not in known_tools:
        return CallError(
            f"unknown tool {name!r}; available: {', '.join(sorted(known_tools)) or 'none'}", "unknown_tool"
        )
    if "arguments" not in payload:
        return CallError(f"tool call to {name!r} has no 'arguments'", tool=name)
    arguments = payload["arguments"]
    # Some models write the arguments as a JSON string, as OpenAI's API carries them.
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return CallError(f"arguments of {name!r} are not a JSON object", tool=name)
    if not isinstance(arguments, dict):
        return CallError(f"arguments of {name!r} must be a JSON object", tool=name)
    return ToolCall(name, arguments)
