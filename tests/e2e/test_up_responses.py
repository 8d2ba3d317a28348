"""The Responses API with the official openai client against `splitserve up` (1 prefill +
1 decode node, the default model, its embedded Redis): greedy text equals Chat Completions'
for the same conversation, streamed and not; `previous_response_id` carries the turn before;
a forced function call comes back as a `function_call` item and its output goes back in;
`text.format` json_schema gives JSON that validates. Every answer parses in the SDK's types.
Few tokens each, to keep the test short."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
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
