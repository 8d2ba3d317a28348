"""What goes over the wire has OpenAI's shape: every chunk and response validates against the
`openai` package's types, and read as a plain dict carries the keys OpenAI sends, null where
there is no value yet."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from router_fakes import FakeNode, fake_cluster

from models.tokenizer import Tokenizer

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Capital of France?"}]}
TEXT = {"model": "smollm2", "prompt": "The capital of France is"}
CHUNK_KEYS = {"id", "object", "created", "model", "system_fingerprint", "choices"}
pytestmark = pytest.mark.timeout(120)


async def _post(script: list[int], tokenizer: Tokenizer, path: str, body: dict[str, Any]) -> Any:
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient(timeout=60) as client:
        resp = await client.post(c.router_url + path, json=body)
    assert resp.status_code == 200, resp.text
    if not body.get("stream"):
        return resp.json()
    lines = [line[len("data: ") :] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("include_usage", [False, True])
async def test_chat_chunks_carry_null_fields_until_they_have_values(
    tokenizer: Tokenizer, script: list[int], include_usage: bool
) -> None:
    body = CHAT | {"stream": True, "stream_options": {"include_usage": include_usage}}
    chunks = await _post(script, tokenizer, "/v1/chat/completions", body)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
        assert set(chunk) == CHUNK_KEYS | ({"usage"} if include_usage else set())
    with_choices = [c for c in chunks if c["choices"]]
    for chunk in with_choices:
        (choice,) = chunk["choices"]
        assert set(choice) == {"index", "delta", "logprobs", "finish_reason"}
        assert choice["logprobs"] is None
    first = with_choices[0]["choices"][0]["delta"]
    assert first["role"] == "assistant" and isinstance(first["content"], str)
    assert [c["choices"][0]["finish_reason"] for c in with_choices[:-1]] == [None] * (
        len(with_choices) - 1
    )
    assert with_choices[-1]["choices"][0]["finish_reason"] == "stop"
    if include_usage:
        assert all(c["usage"] is None for c in with_choices)
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


async def test_completion_chunks_and_responses_have_every_field(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    chunks = await _post(script, tokenizer, "/v1/completions", TEXT | {"stream": True})
    for chunk in chunks:
        _validate_completion_chunk(chunk)
        assert set(chunk) == CHUNK_KEYS
        (choice,) = chunk["choices"]
        assert set(choice) == {"index", "text", "logprobs", "finish_reason"}
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    whole = await _post(script, tokenizer, "/v1/completions", TEXT)
    Completion.model_validate(whole)
    assert set(whole) == CHUNK_KEYS | {"usage"}
    assert set(whole["choices"][0]) == {"index", "text", "logprobs", "finish_reason"}


def _validate_completion_chunk(chunk: dict[str, Any]) -> None:
    """openai's Completion type declares finish_reason non-null, while OpenAI streams send
    null until the last chunk (and the client parses them into that type unvalidated): the
    rest of the chunk is validated as it is."""
    filled = [c | {"finish_reason": c["finish_reason"] or "stop"} for c in chunk["choices"]]
    Completion.model_validate(chunk | {"choices": filled})


async def test_chat_response_has_every_field(tokenizer: Tokenizer, script: list[int]) -> None:
    whole = await _post(script, tokenizer, "/v1/chat/completions", CHAT)
    ChatCompletion.model_validate(whole)
    assert set(whole) == CHUNK_KEYS | {"usage"}
    (choice,) = whole["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["logprobs"] is None and choice["finish_reason"] == "stop"
    assert choice["message"] | {"content": ""} == {
        "role": "assistant", "content": "", "refusal": None, "annotations": [],
        "reasoning_content": None,  # the thinking, with a reasoning parser (as vLLM sends)
    }  # fmt: skip
