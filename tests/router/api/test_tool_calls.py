"""Tool calls through the router: definitions in the prompt, calls parsed into OpenAI's
`tool_calls` (streamed as OpenAI streams them), forced calls constrained by a grammar that
accepts only a call of the allowed functions, tool results accepted, bad definitions 400."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import llguidance
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from router_fakes import FakeNode, fake_cluster

from models.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(120)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
BAD = {"type": "foo"}
CALL = '{"name":"get_weather","arguments":{"city":"Paris"}}'


def _chat(**extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    return {"model": "smollm2", "messages": messages, "max_tokens": 60} | extra


def _script(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) + [min(tokenizer.eos_token_ids)]


async def _serve(
    tokenizer: Tokenizer, text: str, body: dict[str, Any]
) -> tuple[httpx.Response, FakeNode]:
    script = _script(tokenizer, text)
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient(timeout=60) as client:
        resp = await client.post(c.router_url + "/v1/chat/completions", json=body)
    return resp, nodes[0]


def _chunks(resp: httpx.Response) -> list[dict[str, Any]]:
    lines = [x[len("data: ") :] for x in resp.text.splitlines() if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def _prompt(tokenizer: Tokenizer, node: FakeNode) -> str:
    return tokenizer.decode(node.prefills[0].prompt_token_ids, skip_special_tokens=False)


@pytest.mark.parametrize(
    ("choice", "text"),
    [("auto", f"<tool_call>{CALL}</tool_call>"), ("required", CALL),
     ({"type": "function", "function": {"name": "get_weather"}}, CALL)],
)  # fmt: skip
async def test_a_call_comes_back_as_tool_calls(
    tokenizer: Tokenizer, choice: Any, text: str
) -> None:
    resp, prefill = await _serve(tokenizer, text, _chat(tools=[WEATHER, TIME], tool_choice=choice))
    assert resp.status_code == 200, resp.text
    body = resp.json()
    reply = ChatCompletion.model_validate(body)
    (choice_out,) = reply.choices
    assert choice_out.finish_reason == "tool_calls" and choice_out.message.content is None
    (call,) = choice_out.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert body["choices"][0]["message"]["role"] == "assistant"
    prompt = _prompt(tokenizer, prefill)
    assert "get_weather" in prompt and ("<tool_call>" in prompt) == (choice == "auto")
    forced = prefill.prefills[0].sampling.grammar is not None
    assert forced == (choice != "auto")


async def test_a_streamed_call_has_openais_chunk_shape(tokenizer: Tokenizer) -> None:
    body = _chat(tools=[WEATHER], tool_choice="required", stream=True)
    resp, _ = await _serve(tokenizer, CALL, body)
    assert resp.status_code == 200, resp.text
    chunks = _chunks(resp)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    head = deltas[0]
    assert head["role"] == "assistant" and head["content"] is None
    (call,) = head["tool_calls"]
    assert call["index"] == 0 and call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": ""}
    arguments = "".join(
        t["function"].get("arguments", "") for d in deltas[1:] for t in d.get("tool_calls", [])
    )
    assert json.loads(arguments) == {"city": "Paris"}
    assert deltas[-1] == {}
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons == [None] * (len(chunks) - 1) + ["tool_calls"]


def stopped_content(resp: httpx.Response, stream: bool) -> str:
    """The content of an answer that is no call: it stopped, with no tool_calls."""
    assert resp.status_code == 200, resp.text
    if stream:
        chunks = _chunks(resp)
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert not any("tool_calls" in c["choices"][0]["delta"] for c in chunks if c["choices"])
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    (choice,) = resp.json()["choices"]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    return str(choice["message"]["content"])


@pytest.mark.parametrize("stream", [False, True])
async def test_plain_text_under_auto_stays_content(tokenizer: Tokenizer, stream: bool) -> None:
    text = "It is sunny in Paris."
    resp, _ = await _serve(tokenizer, text, _chat(tools=[WEATHER], stream=stream))
    assert stopped_content(resp, stream) == text


async def test_tool_choice_none_renders_no_tools(tokenizer: Tokenizer) -> None:
    resp, prefill = await _serve(tokenizer, CALL, _chat(tools=[WEATHER], tool_choice="none"))
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == CALL
    assert "get_weather" not in _prompt(tokenizer, prefill)
    assert prefill.prefills[0].sampling.grammar is None


async def test_a_named_choice_accepts_only_that_function(
    tokenizer: Tokenizer, default_model_dir: Path
) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    resp, prefill = await _serve(tokenizer, CALL, _chat(tools=[WEATHER, TIME], tool_choice=choice))
    assert resp.status_code == 200, resp.text
    grammar = prefill.prefills[0].sampling.grammar
    assert grammar is not None
    tok = llguidance.LLTokenizer((default_model_dir / "tokenizer.json").read_text())

    def accepts(text: str) -> bool:
        matcher = llguidance.LLMatcher(tok, grammar)
        return matcher.consume_tokens(tok.tokenize_str(text)) and matcher.is_accepting()

    assert accepts('{"name":"get_time","arguments":{}}')
    assert not accepts(CALL)
    assert not accepts("The time is noon.")


async def test_a_tool_result_round_trip_is_rendered(tokenizer: Tokenizer) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C and sunny"},
    ]
    body = _chat(tools=[WEATHER]) | {"messages": messages}
    resp, prefill = await _serve(tokenizer, "It is 22 C.", body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "It is 22 C."
    prompt = _prompt(tokenizer, prefill)
    assert (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in prompt
    )
    assert "22 C and sunny" in prompt


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
         "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": BAD}}]},
         "tools[0].function.parameters"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"messages": [{"role": "tool", "content": "22 C"}]}, "messages[0]"),
    ],
)  # fmt: skip
async def test_bad_tool_definitions_are_a_400(
    tokenizer: Tokenizer, extra: dict[str, Any], param: str
) -> None:
    resp, prefill = await _serve(tokenizer, CALL, _chat(**extra))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert not prefill.prefills


@pytest.mark.parametrize("stream", [False, True])
async def test_each_of_n_choices_carries_its_own_forced_call(
    tokenizer: Tokenizer, stream: bool
) -> None:
    body = _chat(tools=[WEATHER], tool_choice="required", n=2, seed=3, stream=stream)
    resp, _ = await _serve(tokenizer, CALL, body)
    assert resp.status_code == 200, resp.text
    if not stream:
        reply = ChatCompletion.model_validate(resp.json())
        assert [c.index for c in reply.choices] == [0, 1]
        for choice_out in reply.choices:
            assert choice_out.finish_reason == "tool_calls"
            (call,) = choice_out.message.tool_calls or []
            assert call.function.name == "get_weather"
            assert json.loads(call.function.arguments) == {"city": "Paris"}
        return
    chunks = _chunks(resp)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    for index in (0, 1):
        mine = [
            c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == index
        ]
        names = [t["function"]["name"] for c in mine for t in c["delta"].get("tool_calls") or []
                 if t["function"].get("name")]  # fmt: skip
        args = "".join(t["function"]["arguments"] for c in mine
                       for t in c["delta"].get("tool_calls") or [])  # fmt: skip
        assert names == ["get_weather"] and json.loads(args) == {"city": "Paris"}
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == ["tool_calls"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_forced_call_cut_by_max_tokens_is_length_without_tool_calls(
    tokenizer: Tokenizer, stream: bool
) -> None:
    body = _chat(tools=[WEATHER], tool_choice="required", max_tokens=5, stream=stream)
    resp, _ = await _serve(tokenizer, CALL, body)
    assert resp.status_code == 200, resp.text
    cut = tokenizer.decode(_script(tokenizer, CALL)[:5])
    if not stream:
        (choice,) = resp.json()["choices"]
        assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
        assert choice["message"]["content"] == cut  # the text so far, never a made-up call
        return
    chunks = _chunks(resp)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert not any("tool_calls" in d for d in deltas)
    assert "".join(d.get("content") or "" for d in deltas) == cut
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert reasons[-1] == "length"
