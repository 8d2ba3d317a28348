"""Property-based fuzzing of the router's request schema against the real app over fake
nodes: whatever the body, no 5xx; every 4xx carries the OpenAI error JSON (Anthropic's on
/v1/messages); a 200 is a well-formed answer (or stream). Derandomized, so CI runs the same
bounded set each time."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from router_fakes import FakeNode, fake_cluster
from schema_strategies import bodies

from launcher.redis_server import EmbeddedRedis
from models.tokenizer import Tokenizer
from router.api.messages.request import CountTokensRequest, MessagesRequest
from router.api.requests import ChatCompletionRequest, CompletionRequest
from router.api.responses.request import ResponsesRequest

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]
ERROR_KEYS = {"message", "type", "param", "code"}
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Capital of France?"}]}
COMPLETION = {"model": "smollm2", "prompt": "The capital of France is"}
RESPONSES = {"model": "smollm2", "input": "Capital of France?", "store": False}
MESSAGES = {"model": "smollm2", "max_tokens": 16, "messages": CHAT["messages"]}
TYPED = {"/v1/responses": ("response.completed", "response.incomplete", "error"),
         "/v1/messages": ("message_stop", "error")}  # fmt: skip
FUZZ = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def router(tokenizer: Tokenizer, script: list[int]) -> AsyncIterator[httpx.AsyncClient]:
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    async with (
        _redis() as redis_url,  # the Responses API's store
        fake_cluster(tokenizer, nodes, max_model_len=None, redis_url=redis_url) as c,
        httpx.AsyncClient(base_url=c.router_url, timeout=30) as client,
    ):
        yield client


@contextlib.asynccontextmanager
async def _redis() -> AsyncIterator[str]:
    with EmbeddedRedis() as server:
        yield server.url


def _check_error(payload: Any, path: str = "") -> None:
    if path.startswith("/v1/messages"):
        assert isinstance(payload, dict) and set(payload) == {"type", "error"}, payload
        assert set(payload["error"]) == {"type", "message"}, payload
        return
    assert isinstance(payload, dict) and set(payload) == {"error"}, payload
    error = payload["error"]
    assert set(error) == ERROR_KEYS and isinstance(error["message"], str), error


def _streamed(body: Any, stream: bool) -> Any:
    return body | {"stream": True} if stream and isinstance(body, dict) else body


async def _check(client: httpx.AsyncClient, path: str, body: Any) -> None:
    async with client.stream("POST", path, content=json.dumps(body)) as resp:
        raw = await resp.aread()
    assert resp.status_code < 500, (resp.status_code, body, raw[:300])
    if resp.status_code >= 400:
        _check_error(json.loads(raw), path)
        return
    if resp.headers["content-type"].startswith("text/event-stream"):
        events = [ln[6:] for ln in raw.decode().splitlines() if ln.startswith("data: ")]
        if path in TYPED:  # typed events, the last one the end or an error
            assert json.loads(events[-1])["type"] in TYPED[path], events[-1]
            return
        assert events[-1] == "[DONE]", events[-3:]
        for event in map(json.loads, events[:-1]):
            if "error" in event:
                _check_error(event)
        return
    answer = json.loads(raw)
    assert (
        "choices" in answer
        or answer.get("object") == "response"
        or answer.get("type") == "message"
        or set(answer) == {"input_tokens"}
    ), answer


@FUZZ
@given(
    body=bodies(ChatCompletionRequest.model_json_schema(), "smollm2", CHAT), stream=st.booleans()
)
async def test_chat_completions_never_5xx(
    router: httpx.AsyncClient, body: Any, stream: bool
) -> None:
    await _check(router, "/v1/chat/completions", _streamed(body, stream))


@FUZZ
@given(body=bodies(CompletionRequest.model_json_schema(), "smollm2", COMPLETION))
async def test_completions_never_5xx(router: httpx.AsyncClient, body: Any) -> None:
    await _check(router, "/v1/completions", body)


@FUZZ
@given(body=bodies(ResponsesRequest.model_json_schema(), "smollm2", RESPONSES))
async def test_responses_never_5xx(router: httpx.AsyncClient, body: Any) -> None:
    await _check(router, "/v1/responses", body)


@FUZZ
@given(body=bodies(MessagesRequest.model_json_schema(), "smollm2", MESSAGES), stream=st.booleans())
async def test_messages_never_5xx(router: httpx.AsyncClient, body: Any, stream: bool) -> None:
    await _check(router, "/v1/messages", _streamed(body, stream))


@FUZZ
@given(body=bodies(CountTokensRequest.model_json_schema(), "smollm2", MESSAGES))
async def test_count_tokens_never_5xx(router: httpx.AsyncClient, body: Any) -> None:
    await _check(router, "/v1/messages/count_tokens", body)
