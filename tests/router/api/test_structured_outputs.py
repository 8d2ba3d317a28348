"""response_format through the router: the schema is compiled once and its grammar travels to
the prefill and the decode node in SamplingParams; a bad schema is a 400 naming the parameter
before any node is called."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import llguidance
import pytest
from openai.types.chat import ChatCompletion
from router_fakes import FakeNode, fake_cluster, metric

from models.tokenizer import Tokenizer
from router.api.structured import JSON_OBJECT_INSTRUCTION

pytestmark = pytest.mark.timeout(120)
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "rank": {"type": "integer", "minimum": 1}},
    "required": ["city"],
}
DOC = '{"city":"Paris","rank":1}'


def _chat(**extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Name a city as JSON."}]
    return {"model": "smollm2", "messages": messages, "max_tokens": 40} | extra


def _json_schema(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


@pytest.fixture
def doc_script(tokenizer: Tokenizer) -> list[int]:
    return tokenizer.encode(DOC, add_special_tokens=False) + [min(tokenizer.eos_token_ids)]


async def _serve(
    tokenizer: Tokenizer, script: list[int], body: dict[str, Any]
) -> tuple[httpx.Response, list[FakeNode], str]:
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient(timeout=60) as client:
        resp = await client.post(c.router_url + "/v1/chat/completions", json=body)
        metrics = (await client.get(c.router_url + "/metrics")).text
    return resp, nodes, metrics


def _accepts(grammar: str, tokenizer_json: str, text: str) -> bool:
    tok = llguidance.LLTokenizer(tokenizer_json)
    matcher = llguidance.LLMatcher(tok, grammar)
    return matcher.consume_tokens(tok.tokenize_str(text)) and matcher.is_accepting()


async def test_a_json_schema_travels_to_both_nodes_as_a_grammar(
    tokenizer: Tokenizer, doc_script: list[int], default_model_dir: Path
) -> None:
    body = _chat(response_format=_json_schema(SCHEMA))
    resp, (prefill, decode), metrics = await _serve(tokenizer, doc_script, body)
    assert resp.status_code == 200, resp.text
    reply = ChatCompletion.model_validate(resp.json())
    assert json.loads(reply.choices[0].message.content or "") == {"city": "Paris", "rank": 1}
    grammar = prefill.prefills[0].sampling.grammar
    assert grammar is not None and decode.decodes[0].sampling.grammar == grammar
    tokenizer_json = (default_model_dir / "tokenizer.json").read_text()
    assert _accepts(grammar, tokenizer_json, DOC)
    assert not _accepts(grammar, tokenizer_json, '{"rank":1}')  # city is required
    assert not _accepts(grammar, tokenizer_json, '{"city": "Paris"}')  # compact JSON only
    assert metric(metrics, "splitserve_router_constrained_requests_total") == 1


async def test_json_object_is_any_object_and_text_is_free(
    tokenizer: Tokenizer, doc_script: list[int], default_model_dir: Path
) -> None:
    resp, (prefill, _), _ = await _serve(
        tokenizer, doc_script, _chat(response_format={"type": "json_object"})
    )
    assert resp.status_code == 200, resp.text
    grammar = prefill.prefills[0].sampling.grammar
    tokenizer_json = (default_model_dir / "tokenizer.json").read_text()
    assert grammar is not None and _accepts(grammar, tokenizer_json, '{"any":[1,2]}')
    assert not _accepts(grammar, tokenizer_json, "[1,2]")
    resp, (prefill, _), _ = await _serve(
        tokenizer, doc_script, _chat(response_format={"type": "text"})
    )
    assert resp.status_code == 200 and prefill.prefills[0].sampling.grammar is None


async def test_json_object_asks_for_json_in_the_system_message(
    tokenizer: Tokenizer, doc_script: list[int]
) -> None:
    body = _chat(response_format={"type": "json_object"})
    resp, (prefill, _), _ = await _serve(tokenizer, doc_script, body)
    assert resp.status_code == 200, resp.text
    prompt = tokenizer.decode(prefill.prefills[0].prompt_token_ids, skip_special_tokens=False)
    assert JSON_OBJECT_INSTRUCTION in prompt and "Name a city as JSON." in prompt
    own_system = {"role": "system", "content": "Be brief."}
    body["messages"] = [own_system, *body["messages"]]
    resp, (prefill, _), _ = await _serve(tokenizer, doc_script, body)
    prompt = tokenizer.decode(prefill.prefills[0].prompt_token_ids, skip_special_tokens=False)
    assert f"Be brief.\n\n{JSON_OBJECT_INSTRUCTION}" in prompt  # added to the user's own
    for other in ({"type": "text"}, _json_schema(SCHEMA)):
        resp, (prefill, _), _ = await _serve(tokenizer, doc_script, _chat(response_format=other))
        prompt = tokenizer.decode(prefill.prefills[0].prompt_token_ids, skip_special_tokens=False)
        assert resp.status_code == 200 and JSON_OBJECT_INSTRUCTION not in prompt


@pytest.mark.parametrize(
    ("response_format", "param", "words"),
    [
        (_json_schema({"type": "foo"}), "response_format.json_schema.schema", "foo"),
        (_json_schema([1, 2]), "response_format.json_schema.schema", "object"),
        (
            _json_schema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),
            "response_format.json_schema.schema",
            "nowhere",
        ),
        ({"type": "json_schema"}, "response_format", "json_schema"),
        ({"type": "xml"}, "response_format.type", "json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}},
            "response_format.json_schema.name",
            "pattern",
        ),
    ],
)
async def test_a_bad_response_format_is_a_400_naming_the_problem(
    tokenizer: Tokenizer, doc_script: list[int], response_format: Any, param: str, words: str
) -> None:
    resp, (prefill, decode), _ = await _serve(
        tokenizer, doc_script, _chat(response_format=response_format)
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"]
    assert not prefill.prefills and not decode.decodes


async def test_a_resumed_decode_carries_the_grammar_and_the_tokens_so_far(
    tokenizer: Tokenizer, doc_script: list[int]
) -> None:
    nodes = [
        FakeNode("p0", "prefill", doc_script),
        FakeNode("d0", "decode", doc_script, die_after=2),
        FakeNode("d1", "decode", doc_script),
    ]
    body = _chat(response_format=_json_schema(SCHEMA))
    async with (
        fake_cluster(tokenizer, nodes, policy="round_robin") as c,
        httpx.AsyncClient(timeout=60) as client,
    ):
        resp = await client.post(c.router_url + "/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == DOC
    (resumed,) = nodes[2].decodes
    assert resumed.kv is None and resumed.output_token_ids == doc_script[:3]
    assert resumed.sampling.grammar == nodes[0].prefills[0].sampling.grammar is not None
