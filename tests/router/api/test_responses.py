"""POST /v1/responses over fake nodes and an embedded Redis, read with the official openai
client: answers and streamed events parse in the SDK's types, a function tool round trip and
`previous_response_id` carry the conversation, `text.format` constrains the output, stored
responses read back and delete, and bad input is a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from router_fakes import ANSWER, FakeNode, fake_cluster
from thinking_model import QWEN3_TEMPLATE, script_of, thinking_tokenizer

from launcher.redis_server import EmbeddedRedis
from models.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(120)
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with EmbeddedRedis() as server:
        yield server.url


def nodes(script: list[int]) -> list[FakeNode]:
    return [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]


def client_of(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def prompt_of(node: FakeNode, tokenizer: Tokenizer, call: int = -1) -> str:
    return tokenizer.decode(node.prefills[call].prompt_token_ids, False)


async def test_text_answers_streamed_and_not(
    tokenizer: Tokenizer, script: list[int], redis_url: str
) -> None:
    async with fake_cluster(tokenizer, nodes(script), redis_url=redis_url) as c:
        client = client_of(c.router_url)
        whole = await client.responses.create(model="smollm2", input="Capital of France?")
        strict = Response.model_validate(whole.to_dict())
        events = [e async for e in await client.responses.create(
            model="smollm2", input="Capital of France?", stream=True)]  # fmt: skip
        stored = await client.responses.retrieve(whole.id)
        deleted = await client.responses.delete(whole.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(whole.id)
    assert strict.output_text == ANSWER and strict.status == "completed"
    assert strict.usage is not None and strict.usage.output_tokens == len(script)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for event in events:
        EVENTS.validate_python(event.to_dict())
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == ANSWER == events[-1].response.output_text
    assert stored.output_text == ANSWER and deleted is None


async def test_a_function_tool_round_trip_with_previous_response_id(
    tokenizer: Tokenizer, redis_url: str
) -> None:
    script = script_of(tokenizer, CALL)
    async with fake_cluster(tokenizer, nodes(script), redis_url=redis_url) as c:
        client = client_of(c.router_url)
        first = await client.responses.create(
            model="smollm2", input="Weather in Paris?", tools=TOOLS, instructions="Be brief."
        )
        call = first.output[-1]
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Paris"}
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"}
        await client.responses.create(
            model="smollm2", input=[output], tools=TOOLS, previous_response_id=first.id
        )
        prompt = prompt_of(c.nodes[0], tokenizer)
    assert "Be brief." not in prompt  # instructions belong to the request that sent them
    assert "Weather in Paris?" in prompt and "get_weather" in prompt and "22 C, sunny" in prompt


async def test_text_format_json_schema_sends_a_grammar(
    tokenizer: Tokenizer, redis_url: str
) -> None:
    script = script_of(tokenizer, '{"city": "Paris"}')
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = {"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}}
    async with fake_cluster(tokenizer, nodes(script), redis_url=redis_url) as c:
        got = await client_of(c.router_url).responses.create(
            model="smollm2", input="Where?", text=fmt, store=False
        )
        sampling = c.nodes[0].prefills[-1].sampling
    assert json.loads(got.output_text) == {"city": "Paris"} and sampling.grammar is not None


async def test_reasoning_comes_back_as_a_reasoning_item(
    default_model_dir: Path, tmp_path: Path, redis_url: str
) -> None:
    qwen3 = thinking_tokenizer(default_model_dir, tmp_path, QWEN3_TEMPLATE)
    script = script_of(qwen3, "<think>\nEasy.\n</think>\n\nParis.")
    settings = {"redis_url": redis_url, "reasoning_parser": "qwen3"}
    async with fake_cluster(qwen3, nodes(script), **settings) as c:
        client = client_of(c.router_url)
        whole = await client.responses.create(model="smollm2", input="Capital?")
        events = [e async for e in await client.responses.create(
            model="smollm2", input="Capital?", stream=True)]  # fmt: skip
    for response in (whole, events[-1].response):
        kinds = [item.type for item in response.output]
        assert kinds == ["reasoning", "message"] and response.output_text == "Paris."
        assert response.output[0].content[0].text == "Easy."


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "image_generation_call", "id": "x"}]}, "input[0].type"),
        ({"input": [{"type": "function_call_output", "call_id": "c1", "output": "1"}]},
         "input[0].call_id"),
        ({"input": "hi", "previous_response_id": "resp_unknown"}, "previous_response_id"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "hi", "background": True}, "background"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
         "input[0].content[0].type"),
        ({"input": 3}, "input"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ],
)  # fmt: skip
async def test_bad_input_is_an_error_naming_the_field(
    tokenizer: Tokenizer, script: list[int], redis_url: str, body: dict[str, Any], param: str
) -> None:
    async with (
        fake_cluster(tokenizer, nodes(script), redis_url=redis_url) as c,
        httpx.AsyncClient(base_url=c.router_url) as http,
    ):
        resp = await http.post("/v1/responses", json={"model": "smollm2"} | body)
    assert 400 <= resp.status_code < 500 and resp.json()["error"]["param"] == param, resp.text
