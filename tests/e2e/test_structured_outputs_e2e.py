"""Structured outputs and tool calls with the official openai client against `splitserve up`
(1 prefill + 1 decode node, the default model): 20 JSON schemas give output that parses and
validates, streamed and not; tool calls round-trip with tool_choice "required" and a named
function, streamed name first, then the arguments as they are generated; a forced call whose
parameters leave objects open parses, or ends in "length" (not "tool_calls") when max_tokens
cuts it; bad schemas and bad tool definitions are 400s. Every response and chunk validates
against the openai package's types."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from cluster_harness import Cluster, running_cluster
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from bench.grammar_schemas import SCHEMAS

pytestmark = pytest.mark.e2e
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["C", "F"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


OPEN_WEATHER = {  # as most users write it: objects open, strings unbounded
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
OPEN_SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object", "properties": {"site": {"type": "string"}}},
            },
            "required": ["query"],
        },
    },
}
OPEN_TOOLS = {"get_weather": OPEN_WEATHER, "search": OPEN_SEARCH}
# with open objects in the grammar the default model added keys to these until max_tokens
QUESTIONS = ("What is the weather in Paris?", "Is it cold in Oslo today?", "hi")


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("up-structured")
    with running_cluster(default_model_dir, run_dir, "--num-kv-blocks", "512") as up:
        yield up


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    return cluster.openai_client(timeout_s=300)


def _messages(schema: dict[str, Any]) -> list[dict[str, Any]]:
    # the schema in the prompt makes it long enough to go through the prefill pool
    text = f"Reply with JSON that matches this schema: {json.dumps(schema)}"
    return [{"role": "user", "content": text}]


def _one(client: openai.OpenAI, index: int, stream: bool) -> tuple[str, str | None]:
    schema, _ = SCHEMAS[index]
    args: dict[str, Any] = {
        "model": "smollm2",
        "messages": _messages(schema),
        "max_tokens": 150,
        "temperature": 0.7,
        "seed": index,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": f"s{index}", "schema": schema, "strict": True},
        },
    }
    if not stream:
        reply = client.chat.completions.create(**args)
        ChatCompletion.model_validate(reply.to_dict())
        return reply.choices[0].message.content or "", reply.choices[0].finish_reason
    text, finish = "", None
    for chunk in client.chat.completions.create(**args, stream=True):
        ChatCompletionChunk.model_validate(chunk.to_dict())
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


@pytest.mark.parametrize("stream", [False, True])
def test_twenty_schemas_give_valid_json(client: openai.OpenAI, stream: bool) -> None:
    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda i: _one(client, i, stream), range(len(SCHEMAS))))
    for (schema, _), (text, finish) in zip(SCHEMAS, results, strict=True):
        assert finish == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema)


def _ask(client: openai.OpenAI, messages: list[dict[str, Any]], choice: Any) -> ChatCompletion:
    reply = client.chat.completions.create(
        model="smollm2",
        messages=messages,  # type: ignore[arg-type]
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice=choice,
        max_tokens=60,
        temperature=0,
    )
    ChatCompletion.model_validate(reply.to_dict())
    return reply


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
def test_a_tool_call_round_trip(client: openai.OpenAI, choice: Any) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = _ask(client, messages, choice).choices[0]
    assert first.finish_reason == "tool_calls"
    (call,) = first.message.tool_calls or []
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    tool = WEATHER if call.function.name == "get_weather" else TIME
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    messages.append(first.message.to_dict())
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "22 C, sunny, 14:00"})
    final = _ask(client, messages, "none").choices[0]
    assert final.message.tool_calls is None
    assert final.message.content and final.finish_reason in ("stop", "length")


def test_a_streamed_forced_call_streams_its_name_then_its_arguments(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Time in Berlin?"}],
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=60,
        temperature=0,
        stream=True,
    )
    names, arguments, finish = [], [], None
    for chunk in stream:
        ChatCompletionChunk.model_validate(chunk.to_dict())
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                assert call.index == 0 and call.function is not None
                if call.function.name:
                    assert not arguments  # the name comes first, with arguments ""
                    names.append(call.function.name)
                elif call.function.arguments:
                    arguments.append(call.function.arguments)
            finish = choice.finish_reason or finish
    assert names == ["get_time"] and finish == "tool_calls"
    assert len(arguments) >= 2, arguments  # as they were generated, not at the end in one
    jsonschema.validate(json.loads("".join(arguments)), TIME["function"]["parameters"])


def _forced_call(
    client: openai.OpenAI, question: str, max_tokens: int, stream: bool
) -> tuple[str | None, list[tuple[str, str]]]:
    """(finish_reason, [(name, arguments)]) of a forced call, streamed or not."""
    args: dict[str, Any] = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": question}],
        "tools": list(OPEN_TOOLS.values()),
        "tool_choice": "required",
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if not stream:
        reply = client.chat.completions.create(**args)
        ChatCompletion.model_validate(reply.to_dict())
        choice = reply.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return choice.finish_reason, calls
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    finish = None
    for chunk in client.chat.completions.create(**args, stream=True):
        ChatCompletionChunk.model_validate(chunk.to_dict())
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                fn = call.function
                names[call.index] = names.get(call.index, "") + ((fn.name or "") if fn else "")
                arguments[call.index] = arguments.get(call.index, "") + (
                    (fn.arguments or "") if fn else ""
                )
            finish = choice.finish_reason or finish
    return finish, [(names[i], arguments.get(i, "")) for i in sorted(names)]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("max_tokens", [6, 300])
def test_a_forced_call_with_an_open_schema_parses_or_says_length(
    client: openai.OpenAI, max_tokens: int, stream: bool
) -> None:
    """Parameters without additionalProperties: every reply is a call whose arguments validate
    (and hold only the declared keys: the grammar closed the object), or finish_reason "length"
    with no tool_calls (streamed: at most the start of one); with room enough, always a call."""
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        replies = list(pool.map(lambda q: _forced_call(client, q, max_tokens, stream), QUESTIONS))
    for finish, calls in replies:
        if finish == "length":
            assert calls == [] or (stream and len(calls) == 1 and calls[0][0] in OPEN_TOOLS)
            continue
        assert finish == "tool_calls" and len(calls) == 1, (finish, calls)
        name, arguments = calls[0]
        schema: dict[str, Any] = OPEN_TOOLS[name]["function"]["parameters"]  # type: ignore[index]
        value = json.loads(arguments)
        jsonschema.validate(value, schema)
        assert set(value) <= set(schema["properties"]), value
    if max_tokens >= 300:  # the closed grammar ends the call long before
        assert [finish for finish, _ in replies] == ["tool_calls"] * len(QUESTIONS), replies
    else:
        assert [finish for finish, _ in replies] == ["length"] * len(QUESTIONS), replies


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "foo"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
            "tools[0].function.name",
        ),
    ],
)
def test_bad_schemas_and_tools_are_400(
    client: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=4, **extra
        )
    assert info.value.status_code == 400
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == param
    assert error["type"] == "invalid_request_error" and error["message"]
