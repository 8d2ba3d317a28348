"""POST /v1/messages and /v1/messages/count_tokens over fake nodes, read with the official
anthropic client: answers and streamed events parse in the SDK's types (strictly), a
tool_use / tool_result round trip carries the conversation, thinking comes back as thinking
blocks, `x-api-key` is accepted, and bad input is an error in Anthropic's shape naming the
field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from pydantic import TypeAdapter
from router_fakes import ANSWER, FakeNode, fake_cluster, metric
from thinking_model import QWEN3_TEMPLATE, script_of, thinking_tokenizer

from models.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(120)
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TOOLS = [{"name": "get_weather", "input_schema": {"type": "object"}}]
ASK = [{"role": "user", "content": "Capital of France?"}]
EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
ANTHROPIC_ERROR = {"type", "error"}


def nodes(script: list[int]) -> list[FakeNode]:
    return [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]


def client_of(url: str, key: str = "x") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)


def prompt_of(node: FakeNode, tokenizer: Tokenizer) -> str:
    return tokenizer.decode(node.prefills[-1].prompt_token_ids, False)


async def raw_events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a streamed message as sent (the SDK drops pings), each checked to parse
    in the SDK's event types and to name its type in its `event:` line."""
    async with httpx.AsyncClient(base_url=url) as http:
        resp = await http.post("/v1/messages", json=body)
    events = []
    for block in resp.text.strip().split("\n\n"):
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}", block
        if event["type"] != "ping":
            EVENTS.validate_python(event)
        events.append(event)
    return events


def strict(message: Any) -> Message:
    return Message.model_validate(message.to_dict(), strict=True)


async def test_text_answers_streamed_and_not(tokenizer: Tokenizer, script: list[int]) -> None:
    async with fake_cluster(tokenizer, nodes(script)) as c:
        client = client_of(c.router_url)
        whole = strict(await client.messages.create(model="smollm2", max_tokens=64, messages=ASK))
        events = await raw_events(c.router_url, {"model": "smollm2", "max_tokens": 64,
                                                 "messages": ASK, "stream": True})  # fmt: skip
        async with client.messages.stream(model="smollm2", max_tokens=64, messages=ASK) as s:
            final = strict(await s.get_final_message())
    assert whole.content[0].type == "text" and whole.content[0].text == ANSWER
    assert whole.stop_reason == "end_turn" and whole.usage.output_tokens == len(script)
    assert whole.usage.input_tokens > 0
    kinds = [e["type"] for e in events]
    deltas = len(kinds) - 6
    assert kinds == ["message_start", "ping", "content_block_start",
                     *["content_block_delta"] * deltas, "content_block_stop", "message_delta",
                     "message_stop"]  # fmt: skip
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == ANSWER
    assert events[0]["message"]["usage"]["input_tokens"] == whole.usage.input_tokens
    assert final.content == whole.content and final.usage == whole.usage
    assert final.stop_reason == "end_turn"


async def test_unknown_fields_are_counted_by_name(tokenizer: Tokenizer, script: list[int]) -> None:
    """Fields of Anthropic's API the router does not read (prompt caching, service tiers)
    are ignored, counted and logged by name, as on the other routes."""
    cached = {"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}
    body = {"model": "smollm2", "max_tokens": 4, "service_tier": "auto",
            "messages": [{"role": "user", "content": [cached]}]}  # fmt: skip
    async with (
        fake_cluster(tokenizer, nodes(script)) as c,
        httpx.AsyncClient(base_url=c.router_url) as http,
    ):
        assert (await http.post("/v1/messages", json=body)).status_code == 200
        assert (await http.post("/v1/messages/count_tokens", json=body)).status_code == 200
        text = (await http.get("/metrics")).text
    name = "splitserve_router_ignored_fields_total"
    assert metric(text, name, route="/v1/messages") == 2
    assert metric(text, name, route="/v1/messages/count_tokens") == 3  # max_tokens too


async def test_max_tokens_and_stop_sequences(tokenizer: Tokenizer, script: list[int]) -> None:
    async with fake_cluster(tokenizer, nodes(script)) as c:
        client = client_of(c.router_url)
        cut = strict(await client.messages.create(model="smollm2", max_tokens=3, messages=ASK))
        stopped = strict(await client.messages.create(
            model="smollm2", max_tokens=64, messages=ASK, stop_sequences=["never", " Paris"],
            extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 5},
        ))  # fmt: skip
        async with client.messages.stream(
            model="smollm2", max_tokens=64, messages=ASK, stop_sequences=[" Paris"]
        ) as s:
            streamed = strict(await s.get_final_message())
        unmatched = strict(await client.messages.create(
            model="smollm2", max_tokens=64, messages=ASK, stop_sequences=["never"]
        ))  # fmt: skip
        sampling = c.nodes[0].prefills[1].sampling  # the one with sampling fields
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    assert stopped.content[0].type == "text"
    assert stopped.content[0].text == ANSWER.split(" Paris")[0]
    for message in (stopped, streamed):
        assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", " Paris")
    assert (unmatched.stop_reason, unmatched.stop_sequence) == ("end_turn", None)
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.5, 0.9, 5)


async def test_a_tool_use_tool_result_round_trip(tokenizer: Tokenizer) -> None:
    script = script_of(tokenizer, CALL)
    async with fake_cluster(tokenizer, nodes(script)) as c:
        client = client_of(c.router_url)
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        first = strict(await client.messages.create(
            model="smollm2", max_tokens=64, messages=ask, tools=TOOLS, system="Be brief."
        ))  # fmt: skip
        use = first.content[-1]
        assert first.stop_reason == "tool_use" and use.type == "tool_use"
        assert use.name == "get_weather" and use.input == {"city": "Paris"}
        async with client.messages.stream(
            model="smollm2", max_tokens=64, messages=ask, tools=TOOLS
        ) as s:
            streamed = strict(await s.get_final_message())
        result = {"type": "tool_result", "tool_use_id": use.id, "content": "22 C, sunny"}
        turns = [*ask, {"role": "assistant", "content": [use.to_dict()]},
                 {"role": "user", "content": [result]}]  # fmt: skip
        await client.messages.create(model="smollm2", max_tokens=64, messages=turns, tools=TOOLS)
        prompt = prompt_of(c.nodes[0], tokenizer)
    assert streamed.stop_reason == "tool_use" and streamed.content[-1].type == "tool_use"
    assert streamed.content[-1].input == {"city": "Paris"}
    assert "Weather in Paris?" in prompt and "get_weather" in prompt and "22 C, sunny" in prompt


async def test_a_named_tool_choice_sends_a_grammar(tokenizer: Tokenizer) -> None:
    script = script_of(tokenizer, '{"name": "get_weather", "arguments": {"city": "Paris"}}')
    async with fake_cluster(tokenizer, nodes(script)) as c:
        got = strict(await client_of(c.router_url).messages.create(
            model="smollm2", max_tokens=64, messages=ASK, tools=TOOLS,
            tool_choice={"type": "tool", "name": "get_weather"},
        ))  # fmt: skip
        sampling = c.nodes[0].prefills[-1].sampling
    assert got.content[-1].type == "tool_use" and sampling.grammar is not None


async def test_count_tokens_counts_the_rendered_prompt(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    async with fake_cluster(tokenizer, nodes(script)) as c:
        client = client_of(c.router_url)
        counted = await client.messages.count_tokens(model="smollm2", messages=ASK, system="Hi")
        with_tools = await client.messages.count_tokens(
            model="smollm2", messages=ASK, system="Hi", tools=TOOLS
        )
        answered = await client.messages.create(
            model="smollm2", max_tokens=8, messages=ASK, system="Hi"
        )
    MessageTokensCount.model_validate(counted.to_dict(), strict=True)
    assert counted.input_tokens == answered.usage.input_tokens
    assert with_tools.input_tokens > counted.input_tokens


async def test_an_assistant_prefill_is_continued(tokenizer: Tokenizer, script: list[int]) -> None:
    """A conversation ending with an assistant turn: the prompt ends inside that turn, as
    Anthropic continues it (and Chat Completions' continue_final_message)."""
    prefill = [*ASK, {"role": "assistant", "content": "The capital of France is"}]
    async with fake_cluster(tokenizer, nodes(script)) as c:
        client = client_of(c.router_url)
        answer = strict(
            await client.messages.create(model="smollm2", max_tokens=8, messages=prefill)
        )
        sent = prompt_of(c.nodes[0], tokenizer)
        counted = await client.messages.count_tokens(model="smollm2", messages=prefill)
        async with httpx.AsyncClient(base_url=c.router_url) as http:
            chat = {"model": "smollm2", "messages": prefill, "max_tokens": 8}
            await http.post("/v1/chat/completions", json=chat | {"continue_final_message": True})
            continued = prompt_of(c.nodes[0], tokenizer)
            wrong = await http.post(
                "/v1/chat/completions",
                json=chat | {"messages": ASK, "continue_final_message": True},
            )
    assert sent.endswith("<|im_start|>assistant\nThe capital of France is"), sent[-80:]
    assert sent.count("<|im_start|>assistant") == 1 and continued == sent
    assert counted.input_tokens == answer.usage.input_tokens
    assert (
        answer.content[0].type == "text"
        and answer.content[0].text == ANSWER[: len(answer.content[0].text)]
    )
    assert wrong.status_code == 400
    assert wrong.json()["error"]["param"] == "continue_final_message"


async def test_thinking_comes_back_as_thinking_blocks(
    default_model_dir: Path, tmp_path: Path
) -> None:
    qwen3 = thinking_tokenizer(default_model_dir, tmp_path, QWEN3_TEMPLATE)
    script = script_of(qwen3, "<think>\nEasy.\n</think>\n\nParis.")
    async with fake_cluster(qwen3, nodes(script), reasoning_parser="qwen3") as c:
        client = client_of(c.router_url)
        whole = strict(await client.messages.create(model="smollm2", max_tokens=64, messages=ASK))
        async with client.messages.stream(model="smollm2", max_tokens=64, messages=ASK) as s:
            streamed = strict(await s.get_final_message())
        again = [*ASK, {"role": "assistant", "content": [b.to_dict() for b in whole.content]},
                 {"role": "user", "content": "And Italy?"}]  # fmt: skip
        await client.messages.create(model="smollm2", max_tokens=8, messages=again)
        prompt = prompt_of(c.nodes[0], qwen3)
        await client.messages.create(
            model="smollm2", max_tokens=8, messages=ASK, thinking={"type": "disabled"}
        )
        off = prompt_of(c.nodes[0], qwen3)
        await client.messages.create(
            model="smollm2", max_tokens=8, messages=ASK, thinking={"type": "adaptive"}
        )
        adaptive = prompt_of(c.nodes[0], qwen3)
    for message in (whole, streamed):
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert message.content[0].thinking == "Easy."  # type: ignore[union-attr]
        assert message.content[1].text == "Paris."  # type: ignore[union-attr]
    assert "<think>\nEasy.\n</think>" in prompt
    assert off.endswith("<think>\n\n</think>\n\n") and not adaptive.endswith("</think>\n\n")


async def test_x_api_key_is_accepted_where_keys_are_set(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    async with fake_cluster(tokenizer, nodes(script), api_key="key-one") as c:
        got = await client_of(c.router_url, "key-one").messages.create(
            model="smollm2", max_tokens=8, messages=ASK
        )
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await client_of(c.router_url, "key-two").messages.create(
                model="smollm2", max_tokens=8, messages=ASK
            )
    assert got.content[0].type == "text"
    assert refused.value.body == {"type": "error", "error": refused.value.body["error"]}  # type: ignore[index]
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": ASK}, "max_tokens"),
        ({"max_tokens": 0, "messages": ASK}, "max_tokens"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}]}]},
         "messages[0].content[0].tool_use_id"),
        ({"max_tokens": 8, "messages": [
            {"role": "assistant", "content": [TOOL_USE]}, {"role": "user", "content": "hi"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]}]},
         "messages[2].content[0].tool_use_id"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
         "messages[0].content[0].type"),
        ({"max_tokens": 8, "messages": ASK, "tools": [{"type": "web_search_20250305",
                                                       "name": "web_search"}]},
         "tools[0].type"),
        ({"max_tokens": 8, "messages": ASK, "stop_sequences": [""]}, "stop_sequences"),
        ({"max_tokens": 8, "messages": ASK, "mcp_servers": [{"url": "x"}]}, "mcp_servers"),
        ({"max_tokens": 8, "messages": [{"role": "system", "content": "hi"}]},
         "messages[0].role"),
    ],
)  # fmt: skip
async def test_bad_input_is_an_anthropic_error_naming_the_field(
    tokenizer: Tokenizer, script: list[int], body: dict[str, Any], param: str
) -> None:
    async with (
        fake_cluster(tokenizer, nodes(script)) as c,
        httpx.AsyncClient(base_url=c.router_url) as http,
    ):
        resp = await http.post("/v1/messages", json={"model": "smollm2"} | body)
        counted = await http.post("/v1/messages/count_tokens", json={"model": "smollm2"} | body)
        unknown = await http.post("/v1/messages", json={"model": "other", "max_tokens": 8,
                                                        "messages": ASK})  # fmt: skip
    assert resp.status_code == 400, resp.text
    error = resp.json()
    assert set(error) == ANTHROPIC_ERROR and error["type"] == "error", error
    assert error["error"]["type"] == "invalid_request_error" and param in error["error"]["message"]
    if param not in ("max_tokens", "stop_sequences"):  # fields count_tokens does not take
        assert counted.status_code == 400 and param in counted.json()["error"]["message"]
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
