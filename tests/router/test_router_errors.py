"""Bad input gets the right status and OpenAI's error JSON, never a 500."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from router_fakes import FakeNode, dead_url, router_settings

from cluster.registry import StaticMembership
from models.tokenizer import Tokenizer
from router.app import create_app

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "Hello there"}]
CONTEXT = 64  # the fake nodes' max_model_len


@asynccontextmanager
async def router_client(
    tokenizer: Any, nodes: bool = True, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The router app in-process (ASGI transport) over node records that are never called."""
    records = [
        FakeNode(n, role, [1], url=dead_url(), max_model_len=CONTEXT).record()  # type: ignore[arg-type]
        for n, role in (("p0", "prefill"), ("d0", "decode"))
    ]
    membership = StaticMembership(records if nodes else [])
    app = create_app(router_settings(**settings), membership=membership, tokenizer=tokenizer)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://router") as client,
    ):
        yield client


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "smollm2", "messages": MSG} | fields


def _comp(**fields: Any) -> dict[str, Any]:
    return {"model": "smollm2", "prompt": "Hello"} | fields


def _error(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    return error


CASES = [
    # (path, body, status, param)
    (CHAT, _chat(model="gpt-4"), 404, "model"),
    (CHAT, _chat(temperature="hot"), 400, "temperature"),
    (CHAT, _chat(max_tokens="10"), 400, "max_tokens"),
    (CHAT, _chat(stream="yes"), 400, "stream"),
    (CHAT, _chat(messages="hi"), 400, "messages"),
    (CHAT, _chat(messages=[{"role": "robot", "content": "x"}]), 400, "messages[0].role"),
    (CHAT, _chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    (CHAT, _chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400,
     "messages[0].content"),
    (CHAT, _chat(messages=[]), 400, "messages"),
    (CHAT, {"model": "smollm2"}, 400, "messages"),
    (CHAT, _chat(temperature=3), 400, "temperature"),
    (CHAT, _chat(top_p=0), 400, "top_p"),
    (CHAT, _chat(top_k=-1), 400, "top_k"),
    (CHAT, _chat(max_tokens=0), 400, "max_tokens"),
    (CHAT, _chat(presence_penalty=-3), 400, "presence_penalty"),
    (CHAT, _chat(logprobs=True, top_logprobs=25), 400, "top_logprobs"),
    (CHAT, _chat(top_logprobs=2), 400, "top_logprobs"),
    (CHAT, _chat(n=0), 400, "n"),
    (CHAT, _chat(n=17), 400, "n"),
    (CHAT, _chat(n="2"), 400, "n"),
    (CHAT, _chat(stop=["x"] * 20), 400, "stop"),
    (CHAT, _chat(stop=""), 400, "stop"),
    (CHAT, _chat(stop_token_ids=[-1]), 400, "stop_token_ids"),
    (CHAT, _chat(stop_token_ids=[10**9]), 400, "stop_token_ids"),
    (CHAT, _chat(stream_options={"include_usage": True}), 400, "stream_options"),
    (CHAT, _chat(logit_bias={"x": 2.0}), 400, "logit_bias"),
    (CHAT, _chat(logit_bias={"\u00b2": 2.0}), 400, "logit_bias"),
    (CHAT, _chat(logit_bias={"1": 101.0}), 400, "logit_bias"),
    (CHAT, _chat(logit_bias={str(10**9): 1.0}), 400, "logit_bias"),
    (CHAT, _chat(logit_bias={str(i): 1.0 for i in range(301)}), 400, "logit_bias"),
    (CHAT, _chat(tools=[{"type": "function"}]), 400, "tools[0].function"),
    (CHAT, _chat(max_tokens=60), 400, "max_tokens"),
    (CHAT, _chat(max_completion_tokens=60), 400, "max_completion_tokens"),
    (CHAT, _chat(messages=[{"role": "user", "content": "word " * 100}]), 400, "messages"),
    (COMP, _comp(max_tokens=100), 400, "max_tokens"),
    (COMP, _comp(prompt="word " * 100, max_tokens=1), 400, "prompt"),
    (COMP, _comp(prompt=""), 400, "prompt"),
    (COMP, _comp(prompt=[]), 400, "prompt"),
    (COMP, _comp(prompt=[10**9]), 400, "prompt"),
    (COMP, _comp(prompt=["a", "b"]), 400, "prompt"),
    (COMP, _comp(prompt=7), 400, "prompt"),
    (COMP, _comp(echo="yes"), 400, "echo"),
    (COMP, _comp(logprobs=50), 400, "logprobs"),
    (COMP, _comp(n=3, best_of=2), 400, "best_of"),
    (COMP, _comp(best_of=17), 400, "best_of"),
    (COMP, _comp(best_of=3, stream=True), 400, "best_of"),
    (COMP, _comp(suffix="x"), 400, "suffix"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "param"), CASES)
async def test_bad_field_names_the_parameter(
    tokenizer: Tokenizer, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    async with router_client(tokenizer) as client:
        resp = await client.post(path, json=body)
    assert resp.status_code == status, resp.text
    error = _error(resp)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("raw", "code"),
    [(b'{"model": "smollm2", ', "invalid_json"), (b"\xff\xfe", "invalid_json"), (b"[1, 2]", None)],
)
async def test_malformed_bodies_are_400(tokenizer: Tokenizer, raw: bytes, code: str | None) -> None:
    async with router_client(tokenizer) as client:
        resp = await client.post(CHAT, content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 400
    error = _error(resp)
    if code:
        assert error["code"] == code


async def test_oversized_body_is_413(tokenizer: Tokenizer) -> None:
    async with router_client(tokenizer, max_body_bytes=2048) as client:
        big = json.dumps(_chat(messages=[{"role": "user", "content": "x" * 4096}]))
        resp = await client.post(CHAT, content=big)

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted as read
            for _ in range(8):
                yield b" " * 1024

        streamed = await client.post(CHAT, content=chunked())
    assert resp.status_code == 413 and _error(resp)["code"] == "request_too_large"
    assert streamed.status_code == 413


async def test_api_key_is_required_when_set(tokenizer: Tokenizer) -> None:
    async with router_client(tokenizer, api_key="sekrit") as client:
        missing = await client.post(CHAT, json=_chat())
        wrong = await client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        right = await client.get("/v1/models", headers={"Authorization": "Bearer sekrit"})
        health = await client.get("/health")
    assert missing.status_code == 401 and wrong.status_code == 401
    assert _error(missing)["code"] == "invalid_api_key"
    assert right.status_code == 200 and health.status_code == 200


async def test_no_nodes_is_503_with_retry_after(tokenizer: Tokenizer) -> None:
    async with router_client(tokenizer, nodes=False) as client:
        resp = await client.post(CHAT, json=_chat())
        ready = await client.get("/ready")
    assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
    assert _error(resp)["type"] == "server_error"
    assert ready.status_code == 503


async def test_unknown_route_and_method_answer_in_openai_format(tokenizer: Tokenizer) -> None:
    async with router_client(tokenizer) as client:
        missing = await client.get("/v1/nope")
        method = await client.get(CHAT)
    assert missing.status_code == 404 and _error(missing)["code"] == "not_found"
    assert method.status_code == 405 and _error(method)["code"] == "method_not_allowed"


async def test_unexpected_failure_is_a_500_without_internals(tokenizer: Tokenizer) -> None:
    class Broken(Tokenizer):
        def render_chat(self, *args: Any, **kwargs: Any) -> str:
            raise RuntimeError("secret internal detail")

    broken = Broken(tokenizer._backend, tokenizer.special_tokens, tokenizer.eos_token_ids)
    async with router_client(broken) as client:
        resp = await client.post(CHAT, json=_chat())
        after = await client.get("/ready")
    assert resp.status_code == 500
    assert "secret" not in resp.text and _error(resp)["code"] == "internal_error"
    assert after.status_code == 200  # the router keeps serving
