"""Rendering a chat conversation as a harmony prompt (router.api.harmony_render): the system
and developer messages, tools as a TypeScript-like `functions` namespace, an assistant's
reasoning, preamble and calls, tool results, and the thinking of finished turns dropped."""

from __future__ import annotations

from typing import Any

import pytest

from router.api.harmony_render import HarmonyPrompt, render_harmony
from router.api.harmony_tools import ts_type
from router.api.requests import ChatMessage, ToolDefinition

SYSTEM = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: high\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every "
    "message."
)
TOOLS = [
    {"type": "function", "function": {"name": "get_location",
     "description": "Gets the location of the user."}},
    {"type": "function", "function": {
        "name": "get_current_weather",
        "description": "Gets the current weather in the provided location.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string",
                             "description": "The city and state, e.g. San Francisco, CA"},
                "format": {"type": "string", "enum": ["celsius", "fahrenheit"],
                           "default": "celsius"},
            },
            "required": ["location"],
        },
    }},
]  # fmt: skip
NAMESPACE = """# Tools

## functions

namespace functions {

// Gets the location of the user.
type get_location = () => any;

// Gets the current weather in the provided location.
type get_current_weather = (_: {
// The city and state, e.g. San Francisco, CA
location: string,
format?: "celsius" | "fahrenheit", // default: celsius
}) => any;

} // namespace functions"""


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    defs = tuple(ToolDefinition.model_validate(t) for t in tools or [])
    chat = [ChatMessage.model_validate(m) for m in messages]
    return render_harmony(chat, HarmonyPrompt(defs, None, "high", "2025-06-28"))


def test_a_tool_call_conversation_renders_as_the_format_describes() -> None:
    messages = [
        {"role": "system", "content": "Use a friendly tone."},
        {"role": "user", "content": "What is the weather like in SF?"},
        {"role": "assistant", "content": None, "reasoning_content": "Need to use function.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {
             "name": "get_current_weather", "arguments": '{"location": "San Francisco"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"sunny": true, "temperature": 20}'},
    ]  # fmt: skip
    want = (
        SYSTEM + "\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nUse a friendly tone.\n\n"
        + NAMESPACE
        + "<|end|>"
        "<|start|>user<|message|>What is the weather like in SF?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Need to use function.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_current_weather "
        '<|constrain|>json<|message|>{"location":"San Francisco"}<|call|>'
        "<|start|>functions.get_current_weather to=assistant<|channel|>commentary<|message|>"
        '{"sunny": true, "temperature": 20}<|end|>'
        "<|start|>assistant"
    )
    assert render(messages, TOOLS) == want


def test_finished_turns_lose_their_thinking_and_answer_on_final() -> None:
    messages = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Simple arithmetic."},
        {"role": "user", "content": "And 9 / 2?"},
    ]
    want = (
        SYSTEM + "<|end|>"
        "<|start|>user<|message|>What is 2 + 2?<|end|>"
        "<|start|>assistant<|channel|>final<|message|>4.<|end|>"
        "<|start|>user<|message|>And 9 / 2?<|end|>"
        "<|start|>assistant"
    )
    assert render(messages) == want


def test_a_preamble_goes_to_commentary_and_a_result_names_its_function() -> None:
    messages = [
        {"role": "user", "content": "Where am I?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "x", "type": "function",
             "function": {"name": "get_location", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "x", "content": "Paris"},
    ]  # fmt: skip
    text = render(messages, TOOLS)
    assert "<|start|>assistant<|channel|>commentary<|message|>Let me look.<|end|>" in text
    assert "<|start|>functions.get_location to=assistant<|channel|>commentary" in text


def test_a_result_for_no_earlier_call_is_refused_naming_it() -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "tool", "tool_call_id": "nope", "content": "1"},
    ]
    with pytest.raises(ValueError, match=r"messages\[1\].tool_call_id 'nope'"):
        render(messages)


def test_a_bad_reasoning_effort_is_refused() -> None:
    with pytest.raises(ValueError, match="effort"):
        HarmonyPrompt(effort="extreme")


@pytest.mark.parametrize(
    ("schema", "want"),
    [
        ({"type": "integer"}, "number"),
        ({"type": ["string", "null"]}, "string | null"),
        ({"type": "array", "items": {"type": "boolean"}}, "boolean[]"),
        ({"type": "array", "items": {"enum": [1, 2]}}, "(1 | 2)[]"),
        ({"anyOf": [{"type": "string"}, {"const": 3}]}, "string | 3"),
        ({"type": "object"}, "object"),
        (
            {"type": "object", "properties": {"n": {"type": "number", "default": 2}}},
            "{\nn?: number, // default: 2\n}",
        ),
        ({}, "any"),
    ],
)
def test_json_schema_types_as_typescript(schema: dict[str, Any], want: str) -> None:
    assert ts_type(schema) == want
