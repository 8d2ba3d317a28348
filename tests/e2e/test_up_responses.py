"""The Responses API with the official openai client, and Anthropic's Messages API with the
official anthropic client, against `splitserve up` (1 prefill + 1 decode node, the default
model, its embedded Redis): greedy text equals Chat Completions' for the same conversation,
streamed and not; `previous_response_id` carries the turn before; a forced function call
comes back as a `function_call` item (a `tool_use` block) and its output goes back in;
`text.format` json_schema gives JSON that validates; count_tokens counts the prompt the
answer reports. Every answer parses in the SDK's types. Few tokens each, to keep it short."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from anthropic.types import Message
from cluster_harness import Cluster, running_cluster
from openai.types.responses import Response

pytestmark = pytest.mark.e2e
MODEL = "smollm2"
ASK = "What is the capital of France?"
N = 8  # output tokens per request
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("up-responses")
    with running_cluster(default_model_dir, run_dir, "--num-kv-blocks", "256") as up:
        yield up


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    return cluster.openai_client()


def chat_text(client: openai.OpenAI, messages: list[dict[str, str]]) -> str:
    got = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=N,
        temperature=0,  # type: ignore[arg-type]
    )
    return got.choices[0].message.content or ""


def test_greedy_text_equals_chat_completions_streamed_and_not(client: openai.OpenAI) -> None:
    want = chat_text(client, [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": ASK}])  # fmt: skip
    args = {"model": MODEL, "input": ASK, "instructions": "Be brief.", "max_output_tokens": N,
            "temperature": 0}  # fmt: skip
    whole = client.responses.create(**args)  # type: ignore[call-overload]
    Response.model_validate(whole.to_dict())
    events = list(client.responses.create(**args, stream=True))  # type: ignore[call-overload]
    assert whole.output_text == want and whole.status in ("completed", "incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == want


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input=ASK, max_output_tokens=N, temperature=0)
    second = client.responses.create(
        model=MODEL, input="And of Italy?", previous_response_id=first.id,
        max_output_tokens=N, temperature=0,
    )  # fmt: skip
    want = chat_text(client, [{"role": "user", "content": ASK},
                              {"role": "assistant", "content": first.output_text},
                              {"role": "user", "content": "And of Italy?"}])  # fmt: skip
    assert second.output_text == want
    assert client.responses.retrieve(second.id).output_text == want


def test_a_function_tool_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL, input="Weather in Paris?", tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=32,
        temperature=0,
    )  # fmt: skip
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "get_weather"
    assert set(json.loads(call.arguments)) == {"city"}
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "22 C"}
    second = client.responses.create(
        model=MODEL, input=[result], previous_response_id=first.id,  # type: ignore[list-item]
        tools=[WEATHER], max_output_tokens=N, temperature=0,  # type: ignore[list-item]
    )  # fmt: skip
    Response.model_validate(second.to_dict())
    assert second.output and second.usage is not None and second.usage.output_tokens > 0


def test_text_format_json_schema_validates(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
              "required": ["city"], "additionalProperties": False}  # fmt: skip
    got = client.responses.create(
        model=MODEL, input="Name a city as JSON.", max_output_tokens=24, temperature=0,
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
    )  # fmt: skip
    assert set(json.loads(got.output_text)) == {"city"}


def messages_client(cluster: Cluster) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=cluster.base_url, api_key="unused", max_retries=0)


GREEDY = {"temperature": 0}  # the SDK has no sampling arguments: they go in the body


def test_messages_greedy_text_equals_chat_completions_streamed_and_not(
    cluster: Cluster, client: openai.OpenAI
) -> None:
    want = chat_text(client, [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": ASK}])  # fmt: skip
    claude = messages_client(cluster)
    args = {"model": MODEL, "max_tokens": N, "system": "Be brief.",
            "messages": [{"role": "user", "content": ASK}], "extra_body": GREEDY}  # fmt: skip
    whole = Message.model_validate(claude.messages.create(**args).to_dict(), strict=True)  # type: ignore[arg-type]
    with claude.messages.stream(**args) as stream:  # type: ignore[arg-type]
        streamed = stream.get_final_message()
    counted = claude.messages.count_tokens(
        model=MODEL, system="Be brief.", messages=[{"role": "user", "content": ASK}]
    )
    for message in (whole, streamed):
        assert [b.type for b in message.content] == ["text"]
        assert message.content[0].text == want  # type: ignore[union-attr]
        assert message.stop_reason in ("end_turn", "max_tokens")
    assert counted.input_tokens == whole.usage.input_tokens == streamed.usage.input_tokens


def test_messages_tool_use_tool_result_round_trip(cluster: Cluster) -> None:
    claude = messages_client(cluster)
    weather = {"name": "get_weather", "input_schema": WEATHER["parameters"]}
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    first = claude.messages.create(
        model=MODEL, max_tokens=32, messages=ask, tools=[weather],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY,
    )  # fmt: skip
    use = first.content[-1]
    assert use.type == "tool_use" and use.name == "get_weather" and set(use.input) == {"city"}
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "22 C"}
    second = claude.messages.create(
        model=MODEL, max_tokens=N, tools=[weather], extra_body=GREEDY,  # type: ignore[list-item]
        messages=[*ask, {"role": "assistant", "content": [use.to_dict()]},  # type: ignore[list-item]
                  {"role": "user", "content": [result]}],
    )  # fmt: skip
    Message.model_validate(second.to_dict(), strict=True)
    assert second.content and second.usage.output_tokens > 0
