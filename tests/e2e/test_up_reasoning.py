"""Reasoning output from a real model: a tiny Qwen3-shaped model scripted to answer
`<think> Let me think</think> Paris` (scripted_model), served by `splitserve up` (1 prefill +
1 decode node, --reasoning-parser qwen3). The thinking and the answer come apart, streamed
and not, in Chat Completions (`reasoning_content`), Responses (a reasoning item) and
Messages (a thinking block), read with the official openai and anthropic SDKs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types import Message
from cluster_harness import Cluster, running_cluster
from openai.types.responses import Response
from scripted_model import save_scripted_model
from thinking_model import QWEN3_TEMPLATE, thinking_tokenizer

pytestmark = pytest.mark.e2e
MODEL = "scripted-qwen3"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
THINKING, ANSWER = "Let me think", "Paris"


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    model_dir = tmp_path_factory.mktemp("scripted") / MODEL
    tokenizer = thinking_tokenizer(
        default_model_dir, model_dir, QWEN3_TEMPLATE, ("<think>", "</think>")
    )
    prompt = tokenizer.apply_chat_template(ASK)
    eos = min(tokenizer.eos_token_ids)
    said = tokenizer.encode(f"<think> {THINKING}</think> {ANSWER}", add_special_tokens=False)
    save_scripted_model(
        model_dir, [prompt[-1], *said, eos], tokenizer.vocab_size, [eos], family="Qwen3"
    )
    run_dir = tmp_path_factory.mktemp("up-reasoning")
    args = ("--reasoning-parser", "qwen3", "--num-kv-blocks", "64")
    with running_cluster(model_dir, run_dir, *args) as up:
        yield up


GREEDY: dict[str, Any] = {"temperature": 0}


def test_chat_completions_split_thinking_from_the_answer(cluster: Cluster) -> None:
    client = cluster.openai_client()
    whole = client.chat.completions.create(model=MODEL, messages=ASK, **GREEDY)  # type: ignore[arg-type]
    message = whole.choices[0].message
    assert (message.model_extra or {})["reasoning_content"] == THINKING
    assert message.content == ANSWER and whole.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, stream=True, **GREEDY))  # type: ignore[arg-type]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == THINKING
    assert "".join(d.content or "" for d in deltas) == ANSWER


def test_responses_give_a_reasoning_item(cluster: Cluster) -> None:
    client = cluster.openai_client()
    whole = client.responses.create(model=MODEL, input=ASK[0]["content"], **GREEDY)
    Response.model_validate(whole.to_dict())
    kinds = [item.type for item in whole.output]
    assert kinds == ["reasoning", "message"] and whole.output_text == ANSWER
    reasoning = whole.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert "".join(part.text for part in reasoning.content) == THINKING
    events = list(
        client.responses.create(model=MODEL, input=ASK[0]["content"], stream=True, **GREEDY)
    )
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    said = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thought, said) == (THINKING, ANSWER)
    assert events[-1].type == "response.completed"
    assert [i.type for i in events[-1].response.output] == ["reasoning", "message"]


def test_messages_give_a_thinking_block(cluster: Cluster) -> None:
    client = anthropic.Anthropic(base_url=cluster.base_url, api_key="unused", max_retries=0)
    args: dict[str, Any] = {"model": MODEL, "max_tokens": 32, "messages": ASK, "extra_body": GREEDY}
    whole = Message.model_validate(client.messages.create(**args).to_dict(), strict=True)
    with client.messages.stream(**args) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert [b.type for b in message.content] == ["thinking", "text"]
        thinking, text = message.content
        assert thinking.type == "thinking" and thinking.thinking == THINKING
        assert text.type == "text" and text.text == ANSWER
        assert message.stop_reason == "end_turn"


def test_no_block_or_lease_is_left(cluster: Cluster) -> None:
    names = cluster.node_names("prefill") + cluster.node_names("decode")
    for stats in cluster.wait_idle(names).values():
        assert stats.load.free_blocks == stats.load.total_blocks
        assert stats.load.leases_held == 0
