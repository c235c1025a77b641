"""Hermes tool calls: what the model wrote becomes calls to run or error messages it is shown."""

from __future__ import annotations

from services.rollout.agent.parser import CallError, ToolCall, parse_tool_calls

TOOLS = {"calculator", "search"}


def test_good_calls_are_parsed_in_order() -> None:
    text = (
        'Let me compute.<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}\n</tool_call>'
    )
    assert parse_tool_calls(text, TOOLS).calls == [
        ToolCall("calculator", {"expression": "12*34"}),
        ToolCall("search", {"q": "x"}),
    ]


def test_a_turn_without_calls_is_an_answer() -> None:
    assert not parse_tool_calls("The answer is 408.", TOOLS).has_calls


def test_malformed_json_is_an_error_for_the_model() -> None:
    (call,) = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {</tool_call>', TOOLS).calls
    assert isinstance(call, CallError) and "not valid JSON" in call.message and call.kind == "malformed"


def test_an_unclosed_call_is_still_read() -> None:
    (call,) = parse_tool_calls('<tool_call>{"name": "search", "arguments": {"q": "y"}}', TOOLS).calls
    assert call == ToolCall("search", {"q": "y"})


def test_unknown_tool_names_the_available_ones() -> None:
    (call,) = parse_tool_calls('<tool_call>{"name": "shell", "arguments": {}}</tool_call>', TOOLS).calls
    assert call == CallError("unknown tool 'shell'; available: calculator, search", "unknown_tool")


def test_missing_or_bad_arguments_are_errors() -> None:
    missing, not_object, no_name = parse_tool_calls(
        '<tool_call>{"name": "search"}</tool_call><tool_call>{"name": "search", "arguments": [1]}</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call>',
        TOOLS,
    ).calls
    assert missing == CallError("tool call to 'search' has no 'arguments'", "malformed", "search")
    assert not_object == CallError("arguments of 'search' must be a JSON object", "malformed", "search")
    assert no_name == CallError("tool call has no 'name'", "malformed", "")
