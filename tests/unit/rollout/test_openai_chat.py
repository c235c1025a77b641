"""A model turn into OpenAI's message: Hermes tool calls parsed into ``tool_calls``, stop strings cut
at the token that completes them, and requests the endpoint refuses by name."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from relayrl.models.tokenizer import build_byte_tokenizer
from services.rollout.openai_chat import ChatRenderer, ModelTurn, assistant_message
from services.rollout.openai_models import ChatRequest, Message

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]


def _request(**fields: Any) -> ChatRequest:
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_hermes_blocks_become_openai_tool_calls() -> None:
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    text += '\n<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"4\\"}"}</tool_call>'
    message, finish = assistant_message(_request(tools=TOOLS), text, "stop")
    assert finish == "tool_calls"
    assert message.content == "Let me compute."
    assert [c.function.name for c in message.tool_calls] == ["calculator", "calculator"]
    assert [json.loads(c.function.arguments) for c in message.tool_calls] == [
        {"expression": "2+3"},
        {"expression": "4"},
    ]
    assert len({c.id for c in message.tool_calls}) == 2 and all(c.type == "function" for c in message.tool_calls)


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>',  # not JSON
        '<tool_call>{"name": "search", "arguments": {}}</tool_call>',  # not among the request's tools
    ],
)
def test_a_block_that_cannot_be_called_leaves_the_turn_as_content(text: str) -> None:
    message, finish = assistant_message(_request(tools=TOOLS), text, "stop")
    assert message.content == text and message.tool_calls is None and finish == "stop"


def test_tool_choice_none_and_a_cut_off_call_are_not_tool_calls() -> None:
    block = '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>'
    message, finish = assistant_message(_request(tools=TOOLS, tool_choice="none"), block, "stop")
    assert message.tool_calls is None and finish == "stop"
    message, finish = assistant_message(_request(tools=TOOLS), block, "length")
    assert message.tool_calls and finish == "length", "a turn the budget cut keeps 'length'"


def test_a_named_tool_choice_reads_what_the_model_wrote_as_the_arguments() -> None:
    named = _request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "calculator"}})
    message, finish = assistant_message(named, '{"expression": "7*6"}}\n</tool_call>', "stop")
    assert json.loads(message.tool_calls[0].function.arguments) == {"expression": "7*6"} and finish == "stop"
    message, _ = assistant_message(named, "7*6 garbage", "length")
    assert message.tool_calls[0].function.arguments == "7*6 garbage", "invalid JSON is returned as written"


def test_tool_choice_required_opens_a_call_the_model_completes() -> None:
    required = _request(tools=TOOLS, tool_choice="required")
    renderer = ChatRenderer(build_byte_tokenizer())
    assert renderer.decode(renderer.prefill_ids(required)) == "<tool_call>\n"
    message, finish = assistant_message(required, '{"name": "calculator", "arguments": {"x": 1}}\n</tool_call>', "stop")
    assert message.content is None and finish == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("calculator", {"x": 1})
    ]
    message, finish = assistant_message(required, "garbage", "stop")
    assert message.content == "<tool_call>\ngarbage" and message.tool_calls is None and finish == "stop", (
        "a call that does not parse is answered as the text the turn holds"
    )
    for choice in ("auto", "none", None):
        assert renderer.prefill_ids(_request(tools=TOOLS, tool_choice=choice)) == []


@pytest.mark.parametrize(
    "choice",
    [
        "any",
        "REQUIRED",
        {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}},
        {"type": "function"},
        3,
    ],
)
def test_an_unsupported_tool_choice_is_refused_with_the_supported_forms(choice: Any) -> None:
    with pytest.raises(ValidationError, match="tool_choice must be one of 'none', 'auto', 'required' or"):
        _request(tools=TOOLS, tool_choice=choice)


def test_required_or_named_tool_choice_without_tools_is_refused() -> None:
    with pytest.raises(ValidationError, match="tool_choice 'required' needs tools"):
        _request(tool_choice="required")
    assert _request(tool_choice="none").tool_choice == "none", "none and auto ask no call of the model"


def test_a_stop_string_ends_the_turn_at_the_token_that_completes_it() -> None:
    renderer = ChatRenderer(build_byte_tokenizer())
    ids = renderer.encode("abc STOP def")
    turn = ModelTurn(ids, [-0.5] * len(ids), [3] * len(ids), "length")
    cut, text = renderer.cut_at_stop(turn, ["xyz", "STOP", "def"])
    assert text == "abc "
    assert cut.ids == renderer.encode("abc STOP") and cut.finish_reason == "stop"
    assert len(cut.logprobs) == len(cut.versions) == len(cut.ids)
    same, text = renderer.cut_at_stop(turn, ["xyz"])
    assert same is turn and text == "abc STOP def"


def test_the_history_matches_when_arguments_are_re_serialised() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"a": 1, "b": 2}'}}
    sent = Message.model_validate({"role": "assistant", "content": None, "tool_calls": [call], "refusal": None})
    again = json.loads(json.dumps(call))
    again["function"]["arguments"] = '{"b":2,"a":1}'
    assert sent.key() == Message.model_validate({"role": "assistant", "tool_calls": [again]}).key()
    again["function"]["arguments"] = '{"a": 1}'
    assert sent.key() != Message.model_validate({"role": "assistant", "tool_calls": [again]}).key()


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"stream": True}, "stream"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"n": 0}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"tool_choice": {"type": "function", "function": {"name": "calculator"}}}, "tool_choice"),
        ({"messages": []}, "messages"),
    ],
)
def test_requests_the_endpoint_cannot_serve_are_refused_naming_the_field(fields: dict, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})
