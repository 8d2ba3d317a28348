"""n > 1, best_of and echo through the router, over fake prefill/decode nodes: one prefill
per request, the other samples beside sample 0 on its decode node, each choice with its
index and finish_reason, usage counting every sample, and OpenAI's types on the wire."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from router_fakes import ANSWER, FakeNode, fake_cluster, metric

from cluster.protocol import TokenLogprobMsg
from models.tokenizer import Tokenizer
from router.api.choices import Sample, best, sample_seed
from router.api.text_deltas import TextDelta

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Capital of France?"}]}
TEXT = {"model": "smollm2", "prompt": "The capital of France is"}
CHUNK_KEYS = {"id", "object", "created", "model", "system_fingerprint", "choices", "usage"}
pytestmark = pytest.mark.timeout(60)


def _nodes(script: list[int], **decode_kwargs: Any) -> list[FakeNode]:
    return [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script, **decode_kwargs)]


async def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(url + path, json=body)


def _events(resp: httpx.Response) -> list[dict[str, Any]]:
    lines = [line[len("data: ") :] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


async def _eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def test_sample_seeds_are_the_request_seed_then_distinct_hashes() -> None:
    seeds = [sample_seed(7, i) for i in range(16)]
    assert seeds[0] == 7 and len(set(seeds)) == 16
    assert seeds == [sample_seed(7, i) for i in range(16)]  # a function of (seed, index)
    assert all(0 <= s < 2**63 for s in seeds if s is not None)
    assert sample_seed(8, 1) != seeds[1]
    assert sample_seed(None, 3) is None


def test_best_keeps_the_highest_cumulative_logprobs_in_order() -> None:
    def sample(index: int, logprobs: list[float]) -> Sample:
        lps = [TokenLogprobMsg(token_id=1, logprob=v) for v in logprobs]
        return Sample(index, None, None, [TextDelta("x", [1] * len(lps), lps, "stop", 0)])  # type: ignore[arg-type]

    samples = [
        sample(0, [-1.0, -1.0]),
        sample(1, [-0.1, -0.2]),
        sample(2, [-3.0]),
        sample(3, [-0.5]),
    ]
    assert [s.index for s in best(samples, 2)] == [1, 3]
    assert [s.index for s in best(samples, 4)] == [1, 3, 0, 2]


async def test_n_chat_prefills_once_and_answers_every_choice(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    async with fake_cluster(tokenizer, _nodes(script)) as c:
        r = await _post(c.router_url, "/v1/chat/completions", CHAT | {"n": 3, "seed": 11})
        prefill, decode = c.nodes
        await _eventually(lambda: c.app.state.router.admission.inflight == 0)
    assert r.status_code == 200, r.text
    body = r.json()
    ChatCompletion.model_validate(body)
    assert [ch["index"] for ch in body["choices"]] == [0, 1, 2]
    assert all(ch["message"]["content"] == ANSWER for ch in body["choices"])
    assert all(ch["finish_reason"] == "stop" for ch in body["choices"])
    prompt_len = len(prefill.prefills[0].prompt_token_ids)
    assert body["usage"]["prompt_tokens"] == prompt_len
    assert body["usage"]["completion_tokens"] == 3 * len(script)
    # one prefill; sample 0 decodes from its KV handle, the others beside it with no handle
    assert len(prefill.prefills) == 1 and prefill.prefills[0].sampling.seed == 11
    by_id = {d.request_id: d for d in decode.decodes}
    first = by_id[prefill.prefills[0].request_id]
    assert first.kv is not None and first.sampling.seed == 11
    siblings = [d for d in decode.decodes if d is not first]
    assert len(siblings) == 2 and all(d.kv is None and not d.output_token_ids for d in siblings)
    assert sorted(d.sampling.seed for d in siblings) == sorted(
        [sample_seed(11, 1), sample_seed(11, 2)]
    )
    assert len(set(by_id)) == 3 and decode.aborts == []


async def test_n_stream_chunks_carry_their_choice_index_and_finish_reason(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    body = CHAT | {"n": 3, "stream": True, "stream_options": {"include_usage": True}}
    async with fake_cluster(tokenizer, _nodes(script)) as c:
        r = await _post(c.router_url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    chunks = _events(r)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
        assert set(chunk) == CHUNK_KEYS
        assert all(
            set(ch) == {"index", "delta", "logprobs", "finish_reason"} for ch in chunk["choices"]
        )
    texts: dict[int, str] = {}
    finishes: dict[int, list[str | None]] = {}
    roles: dict[int, int] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        i = choice["index"]
        texts[i] = texts.get(i, "") + choice["delta"].get("content", "")
        finishes.setdefault(i, []).append(choice["finish_reason"])
        roles[i] = roles.get(i, 0) + ("role" in choice["delta"])
    assert texts == {0: ANSWER, 1: ANSWER, 2: ANSWER}
    assert roles == {0: 1, 1: 1, 2: 1}
    assert all(f[-1] == "stop" and set(f[:-1]) <= {None} for f in finishes.values())
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 3 * len(script)


async def test_n_stop_string_ends_and_aborts_each_sample(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    async with fake_cluster(tokenizer, _nodes(script, token_delay_s=0.01)) as c:
        r = await _post(c.router_url, "/v1/completions", TEXT | {"n": 2, "stop": ["Paris"]})
        decode = c.nodes[1]
        await _eventually(lambda: len(decode.aborts) == 2)
        await _eventually(lambda: c.app.state.router.admission.inflight == 0)
    assert r.status_code == 200, r.text
    body = r.json()
    Completion.model_validate(body)
    prefix = ANSWER[: ANSWER.index("Paris")]
    assert [(ch["text"], ch["finish_reason"]) for ch in body["choices"]] == [(prefix, "stop")] * 2
    assert sorted(decode.aborts) == sorted(d.request_id for d in decode.decodes)


async def test_n_samples_resume_on_another_decode_node(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = [*_nodes(script, die_after=2), FakeNode("d1", "decode", script)]
    async with fake_cluster(tokenizer, nodes, policy="round_robin") as c:
        r = await _post(c.router_url, "/v1/chat/completions", CHAT | {"n": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [ch["message"]["content"] for ch in body["choices"]] == [ANSWER] * 3
    assert body["usage"]["completion_tokens"] == 3 * len(script)
    assert len(c.nodes[2].decodes) >= 3  # every sample died on its first node and resumed


async def test_n_client_disconnect_aborts_every_sample(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    long_script = script[:-1] * 20 + script[-1:]
    nodes = _nodes(long_script, token_delay_s=0.05)
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient() as client:
        body = CHAT | {"n": 3, "stream": True}
        async with client.stream("POST", c.router_url + "/v1/chat/completions", json=body) as r:
            lines = r.aiter_lines()
            decode = c.nodes[1]
            while len(decode.decodes) < 3:
                await anext(lines)
        await _eventually(lambda: len(decode.aborts) == 3)
        await _eventually(lambda: c.app.state.router.admission.inflight == 0)
        assert sorted(decode.aborts) == sorted(d.request_id for d in decode.decodes)


async def test_best_of_returns_n_and_hides_logprobs_not_asked_for(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    async with fake_cluster(tokenizer, _nodes(script)) as c:
        r = await _post(c.router_url, "/v1/completions", TEXT | {"best_of": 3, "n": 1})
        prefill, decode = c.nodes
    assert r.status_code == 200, r.text
    body = r.json()
    Completion.model_validate(body)
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["text"] == ANSWER and choice["logprobs"] is None
    assert body["usage"]["completion_tokens"] == 3 * len(script)  # every sample generated
    assert len(prefill.prefills) == 1 and len(decode.decodes) == 3
    assert all(d.sampling.logprobs == 0 for d in decode.decodes)  # needed for the ranking


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_prepends_the_prompt(
    tokenizer: Tokenizer, script: list[int], stream: bool
) -> None:
    body = TEXT | {"echo": True, "stream": stream, "n": 2}
    async with fake_cluster(tokenizer, _nodes(script)) as c:
        r = await _post(c.router_url, "/v1/completions", body)
    assert r.status_code == 200, r.text
    if not stream:
        choices = r.json()["choices"]
        assert [ch["text"] for ch in choices] == [TEXT["prompt"] + ANSWER] * 2
        return
    texts: dict[int, list[str]] = {}
    for chunk in _events(r):
        (choice,) = chunk["choices"]
        texts.setdefault(choice["index"], []).append(choice["text"])
    for pieces in texts.values():
        assert pieces[0].startswith(TEXT["prompt"]) and "".join(pieces) == TEXT["prompt"] + ANSWER


async def test_echo_with_logprobs_gives_prompt_tokens_null_logprobs(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    body = TEXT | {"echo": True, "logprobs": 1, "max_tokens": 3}
    async with fake_cluster(tokenizer, _nodes(script)) as c:
        r = await _post(c.router_url, "/v1/completions", body)
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    num_prompt = len(tokenizer.encode(TEXT["prompt"]))
    assert len(lp["tokens"]) == num_prompt + 3
    assert lp["token_logprobs"][:num_prompt] == [None] * num_prompt
    assert lp["top_logprobs"][:num_prompt] == [None] * num_prompt
    assert lp["token_logprobs"][num_prompt:] == [-0.5] * 3
    offsets = lp["text_offset"]
    assert offsets == sorted(offsets) and offsets[num_prompt] == len(TEXT["prompt"])


async def test_n_metrics_count_the_prompt_once_and_every_sample(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    async with fake_cluster(tokenizer, _nodes(script)) as c:
        r = await _post(c.router_url, "/v1/chat/completions", CHAT | {"n": 3})
        await _eventually(lambda: c.app.state.router.admission.inflight == 0)
        async with httpx.AsyncClient() as client:
            text = (await client.get(c.router_url + "/metrics")).text
    usage = r.json()["usage"]
    assert metric(text, "splitserve_router_prompt_tokens_total") == usage["prompt_tokens"]
    assert metric(text, "splitserve_router_completion_tokens_total") == 3 * len(script)
    local = metric(text, "splitserve_router_local_prefill_total", reason="sibling_sample")
    assert local == 2  # the samples beside sample 0 on its decode node


async def test_n_ending_at_token_one_prefills_each_sample(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    async with fake_cluster(tokenizer, _nodes(script)) as c:
        r = await _post(c.router_url, "/v1/completions", TEXT | {"n": 2, "max_tokens": 1})
        prefill, decode = c.nodes
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [(ch["index"], ch["finish_reason"]) for ch in choices] == [(0, "length"), (1, "length")]
    assert len(prefill.prefills) == 2 and decode.decodes == []  # no KV left to share


async def test_n_without_a_seed_gives_each_sample_its_own(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    async with fake_cluster(tokenizer, _nodes(script)) as c:
        for _ in range(2):
            r = await _post(c.router_url, "/v1/chat/completions", CHAT | {"n": 3})
            assert r.status_code == 200, r.text
        prefill, decode = c.nodes
    seeds = [d.sampling.seed for d in decode.decodes]
    assert None not in seeds and len(set(seeds)) == 6  # distinct within and across requests
    for p in prefill.prefills:
        base = p.sampling.seed
        mine = {d.sampling.seed for d in decode.decodes if d.request_id.startswith(p.request_id)}
        assert mine == {sample_seed(base, i) for i in range(3)}
