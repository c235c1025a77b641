"""From chat messages to engine ids and from engine ids to OpenAI choices, token-exactly.

The prompt of a conversation is its first request's messages (and tools) through the model's chat
template; every later request adds only its new messages, rendered by the agent loop's
:class:`~services.rollout.agent.rendering.ObservationRenderer` after the ids the engine returned,
so the model's own turns are never decoded and re-encoded.

A model turn becomes an OpenAI message the way vLLM's Hermes parser reads Qwen2.5 output: text
before the first ``<tool_call>`` is the content, each block a tool call; a block that does not parse
leaves the whole turn as content. A ``stop`` string ends the turn at the token that completes it (as
SGLang keeps that token in ``output_ids``), and only the text before it is answered.

``tool_choice`` as OpenAI documents it: ``none`` answers content only (a ``<tool_call>`` the model
writes stays text), ``auto`` lets the model choose, ``required`` and a named function make the
answer a call. OpenAI forces those with constrained decoding; here the assistant turn is opened
with the call (``<tool_call>\n`` for ``required``, ``<tool_call>\n{"name": <name>, "arguments": ``
for a named one) and the model continues it. Those opening ids are *not* sampled by the model: they
are recorded with the prompt or the observation before the turn (loss mask 0, log-prob 0.0), like
any template text, so the trainer never treats them as policy tokens, and the policy is trained
on what it wrote after them. The engine's next-token distribution after the opening is the
policy's own, so the turn's log-probs stay exact. A ``required`` turn whose text does not parse as
calls to the request's tools is answered as content (the opening included), finish reason
``stop``: nothing constrains the tiny model, and the record keeps what it really wrote.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from services.rollout.agent.parser import CLOSE_TAG, OPEN_TAG, ToolCall, parse_tool_calls
from services.rollout.agent.rendering import ObservationRenderer
from services.rollout.openai_models import (
    AssistantMessage,
    ChatRequest,
    ChoiceLogprobs,
    FunctionCall,
    Message,
    NamedToolChoice,
    TokenLogprob,
    ToolCallOut,
)


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """One turn as the engine generated it, cut at a stop string if one matched."""

    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    # 'stop' (end of turn or a stop string) or 'length' (the budget ran out).
    finish_reason: str


class ChatRenderer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.observations = ObservationRenderer(tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def prompt_ids(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> list[int]:
        """The first request's messages, with the assistant turn opened."""
        text = self.tokenizer.apply_chat_template(
            [m.for_template() for m in messages], tools=tools, tokenize=False, add_generation_prompt=True
        )
        return self.encode(text)

    def observation_ids(self, messages: list[Message], last_turn_ids: list[int]) -> list[int]:
        """Later messages after the model's last turn, with the next assistant turn opened."""
        return self.observations.observation_ids([m.for_template() for m in messages], last_turn_ids)

    def prefill_ids(self, request: ChatRequest) -> list[int]:
        """Template-side ids that open the turn with a call (``required`` or a named tool); none otherwise."""
        opening = forced_opening(request)
        return self.encode(opening) if opening else []

    def cut_at_stop(self, turn: ModelTurn, stops: list[str]) -> tuple[ModelTurn, str]:
        """The turn up to the token that completes the first stop string, and the text before it."""
        text = self.decode(turn.ids)
        hits = [(text.find(s), s) for s in stops if s in text]
        if not hits:
            return turn, text
        at, stop = min(hits)
        end = at + len(stop)
        # Fewest ids whose text contains the whole stop string (decoding a prefix only ever grows).
        low, high = 1, len(turn.ids)
        while low < high:
            mid = (low + high) // 2
            if len(self.decode(turn.ids[:mid])) >= end:
                high = mid
            else:
                low = mid + 1
        return ModelTurn(turn.ids[:low], turn.logprobs[:low], turn.versions[:low], "stop"), text[:at]

    def logprobs(self, turn: ModelTurn) -> ChoiceLogprobs:
        tokens = [self.tokenizer.decode([i], skip_special_tokens=False) for i in turn.ids]
        return ChoiceLogprobs(
            content=[
                TokenLogprob(token=t, logprob=lp, bytes=list(t.encode()))
                for t, lp in zip(tokens, turn.logprobs, strict=True)
            ]
        )


def _named(request: ChatRequest) -> str:
    return request.tool_choice.function.name if isinstance(request.tool_choice, NamedToolChoice) else ""


def _prefill(name: str) -> str:
    return f'{OPEN_TAG}\n{{"name": {json.dumps(name)}, "arguments": '


def forced_opening(request: ChatRequest) -> str:
    """The text the assistant turn starts with before the model writes: a call's opening when one is forced."""
    named = _named(request)
    if named:
        return _prefill(named)
    return f"{OPEN_TAG}\n" if request.tool_choice == "required" else ""


def assistant_message(request: ChatRequest, text: str, finish_reason: str) -> tuple[AssistantMessage, str]:
    """The OpenAI message for a turn's ``text`` and the choice's finish reason."""
    named = _named(request)
    if named:
        # OpenAI (and vLLM) answer a forced named call with finish_reason 'stop'.
        return AssistantMessage(content=None, tool_calls=[_call(named, _forced_arguments(named, text))]), finish_reason
    text = forced_opening(request) + text
    if request.tool_choice == "none" or not request.tools or OPEN_TAG not in text:
        return AssistantMessage(content=text), finish_reason
    parsed = parse_tool_calls(text, {t.function.name for t in request.tools})
    if not parsed.has_calls or not all(isinstance(c, ToolCall) for c in parsed.calls):
        return AssistantMessage(content=text), finish_reason
    calls = [_call(c.name, json.dumps(c.arguments)) for c in parsed.calls if isinstance(c, ToolCall)]
    content = text[: text.index(OPEN_TAG)].strip() or None
    return AssistantMessage(
        content=content, tool_calls=calls
    ), "tool_calls" if finish_reason == "stop" else finish_reason


def _forced_arguments(name: str, text: str) -> str:
    """The arguments the model wrote after the prefilled name: JSON when its block parses, else its raw text."""
    parsed = parse_tool_calls(_prefill(name) + text, {name})
    if parsed.calls and isinstance(parsed.calls[0], ToolCall):
        return json.dumps(parsed.calls[0].arguments)
    return text.split(CLOSE_TAG, 1)[0].strip()


def _call(name: str, arguments: str) -> ToolCallOut:
    return ToolCallOut(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name=name, arguments=arguments))
