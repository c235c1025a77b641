"""The OpenAI chat-completions shapes the rollout serves (``/v1/chat/completions``, ``/v1/models``).

Field names and nesting follow OpenAI's API reference (the ``chat.completion`` object, its
``choices[i].message`` with ``tool_calls``, ``logprobs.content`` and ``usage``), which is what the
``openai`` client parses. Requests accept unknown fields (OpenAI adds them often and clients send
them) except ``stream``, which is refused by name because it is not served; everything the
endpoint reads is checked here, so a bad value is a 422 naming its field before the engine is asked.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class FunctionCall(BaseModel):
    name: str
    # A JSON string, as OpenAI carries it; the model may have written invalid JSON.
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """One message of a request: system, user, assistant (with tool calls) or tool."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # A string, a list of content parts (only their text is read), or None (an assistant tool call).
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallOut] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part.get("text", "")) for part in self.content if part.get("type", "text") == "text")

    def key(self) -> tuple[Any, ...]:
        """What makes two messages the same turn: arguments compare as JSON, so re-serialised is equal."""
        calls = tuple((c.id, c.function.name, _json_or_text(c.function.arguments)) for c in self.tool_calls or ())
        return (self.role, self.text(), calls, self.tool_call_id or "")

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it (tool-call arguments as objects, as HF templates expect)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name:
            out["name"] = self.name
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": _json_or_text(c.function.arguments)},
                }
                for c in self.tool_calls
            ]
        return out


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


class FunctionDef(BaseModel):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class ToolDef(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str = Field(min_length=1)


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


# OpenAI's string values of tool_choice: call no tool, the model decides, call one or more tools.
TOOL_CHOICE_MODES = ("none", "auto", "required")


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = ""
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    n: int = Field(1, ge=1, le=64)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stop: str | list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stop

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, choice: Any) -> Any:
        """One message for every value OpenAI's other forms (``allowed_tools``, ``custom``) or a typo take."""
        if choice is None or choice in TOOL_CHOICE_MODES:
            return choice
        if isinstance(choice, dict) and choice.get("type") == "function":
            function = choice.get("function")
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                return choice
        raise ValueError(
            f"tool_choice must be one of {', '.join(map(repr, TOOL_CHOICE_MODES))} or"
            ' {"type": "function", "function": {"name": ...}}; got ' + json.dumps(choice)[:200]
        )

    @model_validator(mode="after")
    def _served(self) -> ChatRequest:
        if self.stream:
            raise ValueError("stream: streaming is not served; send stream: false (the default)")
        if self.top_logprobs:
            raise ValueError("top_logprobs: only the chosen tokens' log-probs are served (logprobs: true)")
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise ValueError(f"tool_choice {self.tool_choice_label()} needs tools: the model must call one")
        named = self.tool_choice if isinstance(self.tool_choice, NamedToolChoice) else None
        if named is not None and named.function.name not in {t.function.name for t in self.tools or ()}:
            raise ValueError(f"tool_choice names {named.function.name!r}, which is not in tools")
        return self

    def tool_choice_label(self) -> str:
        if isinstance(self.tool_choice, NamedToolChoice):
            return f"naming {self.tool_choice.function.name!r}"
        return repr(self.tool_choice)

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def budget(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[dict[str, Any]] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    # RelayRL's own: the conversation this turn was recorded in (None: not recorded).
    conversation_id: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "relayrl"
    # RelayRL's own: the policy version the engine serves now.
    weight_version: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class FinishRequest(BaseModel):
    """``{"reward": r}``, or ``{"score": true, ...}`` for the rollout's reward function on the last turn."""

    model_config = ConfigDict(extra="forbid")

    reward: float | None = Field(None, allow_inf_nan=False)
    score: bool = False
    data_source: str = ""
    ground_truth: str = ""
    extra_info: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_source(self) -> FinishRequest:
        if (self.reward is None) == (not self.score):
            raise ValueError("send either a reward or score: true (with data_source and ground_truth)")
        return self
