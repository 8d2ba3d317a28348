"""The router's request flow over fake prefill/decode nodes, all on real localhost HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from router_fakes import ANSWER, FakeNode, dead_url, fake_cluster, metric

from models.tokenizer import Tokenizer

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Capital of France?"}]}
pytestmark = pytest.mark.timeout(60)


def _nodes(script: list[int], **decode_kwargs: Any) -> list[FakeNode]:
    return [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script, **decode_kwargs)]


async def _sse(resp: httpx.Response) -> list[Any]:
    """Parsed `data:` payloads of an SSE response ("[DONE]" stays a string)."""
    events = []
    async for line in resp.aiter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _chat_text(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content", "")
        for e in events
        if isinstance(e, dict) and e.get("choices")
    )


async def _eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_streaming_chat_prefills_then_decodes_with_usage(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    async with fake_cluster(tokenizer, _nodes(script)) as c, httpx.AsyncClient() as client:
        body = CHAT | {"stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", c.router_url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = await _sse(r)
    prefill, decode = c.nodes
    assert events[-1] == "[DONE]"
    assert _chat_text(events) == ANSWER
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    finals = [e for e in events[:-1] if e["choices"] and e["choices"][0].get("finish_reason")]
    assert [f["choices"][0]["finish_reason"] for f in finals] == ["stop"]
    usage = events[-2]["usage"]
    assert events[-2]["choices"] == []
    prompt_len = len(prefill.prefills[0].prompt_token_ids)
    assert usage["prompt_tokens"] == prompt_len
    assert usage["completion_tokens"] == len(script)
    assert usage["total_tokens"] == prompt_len + len(script)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 3
    # the decode node got the KV handle and token 1, and generated the rest
    (dec,) = decode.decodes
    assert dec.kv is not None and dec.kv.node_id == "p0"
    assert dec.output_token_ids == [script[0]]
    assert dec.prompt_token_ids == prefill.prefills[0].prompt_token_ids
    assert decode.aborts == [] and prefill.releases == []


async def test_non_streaming_completion(tokenizer: Tokenizer, script: list[int]) -> None:
    async with fake_cluster(tokenizer, _nodes(script)) as c, httpx.AsyncClient() as client:
        body = {"model": "smollm2", "prompt": "The capital of France", "max_tokens": 5}
        r = await client.post(c.router_url + "/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "text_completion"
    assert out["choices"][0]["text"] == tokenizer.decode(script[:5])
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 5
    prompt = c.nodes[0].prefills[0]
    assert prompt.prompt_token_ids == tokenizer.encode("The capital of France")
    assert prompt.sampling.max_tokens == 5


async def test_token_one_reaches_the_client_before_the_decode_starts(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    gate = asyncio.Event()
    nodes = _nodes(script, accept_gate=gate)  # the decode node cannot even accept yet
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient() as client:
        body = CHAT | {"stream": True}
        async with client.stream("POST", c.router_url + "/v1/chat/completions", json=body) as r:
            lines = r.aiter_lines()
            first = await asyncio.wait_for(anext(lines), 5)
            assert first.startswith("data: ")
            delta = json.loads(first[6:])["choices"][0]["delta"]
            assert delta["content"] == tokenizer.decode(script[:1])
            gate.set()
            rest = [line async for line in lines]
    assert "data: [DONE]" in rest


async def test_prefill_retries_another_node_and_marks_the_dead_one(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    dead = FakeNode("p-dead", "prefill", script, url=dead_url())
    nodes = [*_nodes(script), FakeNode("p1", "prefill", script)]
    async with (
        fake_cluster(tokenizer, nodes, extra_records=[dead.record()], policy="round_robin") as c,
        httpx.AsyncClient() as client,
    ):
        # round robin over p-dead, p0, p1: some request meets the dead node first
        for _ in range(3):
            r = await client.post(c.router_url + "/v1/chat/completions", json=CHAT)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == ANSWER
        healthy = {n.info.node_id for n in c.membership.nodes()}
        metrics = (await client.get(c.router_url + "/metrics")).text
    assert "p-dead" not in healthy and {"p0", "p1", "d0"} <= healthy
    assert metric(metrics, "splitserve_router_prefill_retries_total") == 1


async def test_prefill_pool_failing_falls_back_to_local_prefill(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = [
        FakeNode("p0", "prefill", script, prefill_status=500),
        FakeNode("d0", "decode", script),
    ]
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient() as client:
        r = await client.post(c.router_url + "/v1/chat/completions", json=CHAT)
        metrics = (await client.get(c.router_url + "/metrics")).text
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ANSWER
    assert c.nodes[1].decodes[0].kv is None
    assert metric(metrics, "splitserve_router_local_prefill_total", reason="prefill_failed") == 1


async def test_decode_death_gives_an_error_event_then_done(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = _nodes(script, die_after=2)
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient() as client:
        start = time.monotonic()
        body = CHAT | {"stream": True}
        async with client.stream("POST", c.router_url + "/v1/chat/completions", json=body) as r:
            events = await _sse(r)
        elapsed = time.monotonic() - start
        healthy = {n.info.node_id for n in c.membership.nodes()}
    assert elapsed < 5
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["type"] == "server_error" and error["code"] == "node_failed"
    assert _chat_text(events) == tokenizer.decode(script[:3])  # token 1 + 2 decoded
    assert "d0" not in healthy
    assert c.nodes[0].releases == [c.nodes[1].decodes[0].request_id]  # lease freed early


async def test_decode_death_resumes_on_another_decode_node(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = [*_nodes(script, die_after=2), FakeNode("d1", "decode", script)]
    async with (
        fake_cluster(tokenizer, nodes, policy="round_robin") as c,
        httpx.AsyncClient() as client,
    ):
        r = await client.post(c.router_url + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == ANSWER
    assert r.json()["usage"]["completion_tokens"] == len(script)
    (resumed,) = c.nodes[2].decodes
    assert resumed.kv is None and resumed.output_token_ids == script[:3]


async def test_client_disconnect_aborts_the_decode(tokenizer: Tokenizer, script: list[int]) -> None:
    long_script = script[:-1] * 20 + script[-1:]
    nodes = _nodes(long_script, token_delay_s=0.05)
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient() as client:
        body = CHAT | {"stream": True}
        async with client.stream("POST", c.router_url + "/v1/chat/completions", json=body) as r:
            lines = r.aiter_lines()
            for _ in range(6):
                await anext(lines)
        # leaving the block closed the connection mid-stream
        decode = c.nodes[1]
        await _eventually(lambda: decode.aborts == [decode.decodes[0].request_id])
        await _eventually(lambda: c.app.state.router.admission.inflight == 0)
        assert len(decode.decodes) == 1  # aborted, not retried elsewhere


async def test_stop_string_truncates_and_aborts(tokenizer: Tokenizer, script: list[int]) -> None:
    async with fake_cluster(tokenizer, _nodes(script)) as c, httpx.AsyncClient() as client:
        body = CHAT | {"stop": ["Paris", "zzz"]}
        r = await client.post(c.router_url + "/v1/chat/completions", json=body)
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] == ANSWER.split("Paris")[0]
        assert choice["finish_reason"] == "stop"
        decode = c.nodes[1]
        await _eventually(lambda: decode.aborts == [decode.decodes[0].request_id])


async def test_stop_at_token_one_releases_the_lease(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    first_text = tokenizer.decode(script[:1])
    async with fake_cluster(tokenizer, _nodes(script)) as c, httpx.AsyncClient() as client:
        body = CHAT | {"stop": first_text, "stream": True}
        async with client.stream("POST", c.router_url + "/v1/chat/completions", json=body) as r:
            events = await _sse(r)
        prefill, decode = c.nodes
        await _eventually(lambda: prefill.releases == [prefill.prefills[0].request_id])
    assert _chat_text(events) == "" and events[-1] == "[DONE]"
    assert decode.decodes == []


async def test_short_prompt_is_prefilled_on_the_decode_node(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    async with (
        fake_cluster(tokenizer, _nodes(script), local_prefill_max_tokens=32) as c,
        httpx.AsyncClient() as client,
    ):
        body = {"model": "smollm2", "prompt": "Hi", "max_tokens": 4, "stream": True}
        async with client.stream("POST", c.router_url + "/v1/completions", json=body) as r:
            events = await _sse(r)
        metrics = (await client.get(c.router_url + "/metrics")).text
    prefill, decode = c.nodes
    text = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert text == tokenizer.decode(script[:4])
    assert prefill.prefills == []
    assert decode.decodes[0].kv is None and decode.decodes[0].output_token_ids == []
    assert metric(metrics, "splitserve_router_local_prefill_total", reason="short_prompt") == 1


async def test_logit_bias_reaches_both_nodes_as_token_bias_pairs(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    async with fake_cluster(tokenizer, _nodes(script)) as c, httpx.AsyncClient() as client:
        body = CHAT | {"logit_bias": {"42": -100, "7": 2.5}}
        resp = await client.post(c.router_url + "/v1/chat/completions", json=body)
    assert resp.status_code == 200
    prefill, decode = c.nodes
    assert prefill.prefills[0].sampling.logit_bias == ((7, 2.5), (42, -100.0))
    assert decode.decodes[0].sampling.logit_bias == ((7, 2.5), (42, -100.0))


async def test_logprobs_are_returned(tokenizer: Tokenizer, script: list[int]) -> None:
    async with fake_cluster(tokenizer, _nodes(script)) as c, httpx.AsyncClient() as client:
        body = CHAT | {"logprobs": True, "top_logprobs": 2, "max_tokens": 3}
        chat = (await client.post(c.router_url + "/v1/chat/completions", json=body)).json()
        body = {"model": "smollm2", "prompt": "x " * 40, "logprobs": 1, "max_tokens": 3}
        comp = (await client.post(c.router_url + "/v1/completions", json=body)).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [tokenizer.token_to_str(t) for t in script[:3]]
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] == -0.5 for e in content)
    lp = comp["choices"][0]["logprobs"]
    assert lp["tokens"] == [tokenizer.token_to_str(t) for t in script[:3]]
    assert all(len(top) == 1 for top in lp["top_logprobs"])
    assert c.nodes[0].prefills[0].sampling.logprobs == 2


async def test_overload_gives_429_with_retry_after(tokenizer: Tokenizer, script: list[int]) -> None:
    gate = asyncio.Event()
    async with (
        fake_cluster(tokenizer, _nodes(script, gate=gate), max_inflight=1, max_queued=0) as c,
        httpx.AsyncClient() as client,
    ):
        body = CHAT | {"stream": True}
        async with client.stream("POST", c.router_url + "/v1/chat/completions", json=body) as r:
            # Keep the iterator: a dropped one is finalized, which closes the connection and
            # frees the slot before the second request arrives.
            lines = r.aiter_lines()
            await anext(lines)  # token 1 is out; the request holds its slot
            await asyncio.sleep(0.2)  # widens the old race window; the slot must stay held
            second = await client.post(c.router_url + "/v1/chat/completions", json=CHAT)
            gate.set()
            rest = [line async for line in lines if line]
    assert rest[-1] == "data: [DONE]"  # the first request still finishes normally
    assert second.status_code == 429
    assert second.headers["retry-after"] == "1"
    assert second.json()["error"]["type"] == "rate_limit_error"


async def test_a_busy_router_queues_then_serves_and_429s_only_when_the_queue_is_full(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    gate = asyncio.Event()
    url_of = "{}/v1/chat/completions".format
    async with (
        fake_cluster(tokenizer, _nodes(script, gate=gate), max_inflight=1, max_queued=1) as c,
        httpx.AsyncClient(timeout=60) as client,
    ):
        async with client.stream("POST", url_of(c.router_url), json=CHAT | {"stream": True}) as r:
            lines = r.aiter_lines()
            await anext(lines)  # the first request holds the only slot
            queued = asyncio.create_task(client.post(url_of(c.router_url), json=CHAT))
            await _eventually(lambda: c.app.state.router.admission.queued == 1, timeout_s=30)
            third = await client.post(url_of(c.router_url), json=CHAT)
            gate.set()
            rest = [line async for line in lines if line]
        second = await queued
        metrics = (await client.get(c.router_url + "/metrics")).text
    assert rest[-1] == "data: [DONE]"
    assert third.status_code == 429 and third.json()["error"]["code"] == "overloaded"
    assert second.status_code == 200  # it waited for the slot instead of failing
    assert second.json()["choices"][0]["message"]["content"]
    assert metric(metrics, "splitserve_router_queue_seconds_count", priority="0") == 2


async def test_readiness_and_models(tokenizer: Tokenizer, script: list[int]) -> None:
    prefill_only = [FakeNode("p0", "prefill", script)]
    async with fake_cluster(tokenizer, prefill_only) as c, httpx.AsyncClient() as client:
        assert (await client.get(c.router_url + "/ready")).status_code == 503
        assert (await client.get(c.router_url + "/health")).status_code == 200
        c.membership.update([*c.membership.all_nodes(), FakeNode("d0", "decode", []).record()])
        ready = await client.get(c.router_url + "/ready")
        models = (await client.get(c.router_url + "/v1/models")).json()
    assert ready.status_code == 200 and ready.json()["decode_nodes"] == 1
    assert models["data"][0]["id"] == "smollm2"
    assert models["data"][0]["max_model_len"] == 256


async def test_official_openai_client(tokenizer: Tokenizer, script: list[int]) -> None:
    async with fake_cluster(tokenizer, _nodes(script), api_key="sekrit") as c:
        client = openai.AsyncOpenAI(base_url=c.router_url + "/v1", api_key="sekrit")
        chat = await client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Capital of France?"}]
        )
        stream = await client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Capital of France?"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        parts, usage = [], None
        async for chunk in stream:
            parts += [ch.delta.content or "" for ch in chunk.choices]
            usage = chunk.usage or usage
        comp = await client.completions.create(model="smollm2", prompt="Paris is", max_tokens=4)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="gpt-4", messages=[{"role": "user", "content": "hi"}]
            )
        bad = openai.AsyncOpenAI(base_url=c.router_url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
        await client.close()
        await bad.close()
    assert chat.choices[0].message.content == ANSWER
    assert chat.choices[0].finish_reason == "stop"
    assert "".join(parts) == ANSWER and usage is not None
    assert usage.completion_tokens == len(script)
    assert comp.choices[0].text == tokenizer.decode(script[:4])


async def test_non_streaming_client_disconnect_aborts_the_decode(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = _nodes(script[:-1] * 20 + script[-1:], token_delay_s=0.05)
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient(timeout=0.5) as client:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and hangs up
            await client.post(c.router_url + "/v1/chat/completions", json=CHAT)
        decode = c.nodes[1]
        await _eventually(lambda: decode.aborts == [decode.decodes[0].request_id])
        await _eventually(lambda: c.app.state.router.admission.inflight == 0)
        assert len(decode.decodes) == 1  # aborted, not retried elsewhere


async def test_silent_decode_node_times_out_with_an_error_event(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = _nodes(script, gate=asyncio.Event())  # accepts, then never sends a token
    async with (
        fake_cluster(tokenizer, nodes, decode_idle_timeout_s=0.5) as c,
        httpx.AsyncClient() as client,
    ):
        start = time.monotonic()
        r = await client.post(c.router_url + "/v1/chat/completions", json=CHAT | {"stream": True})
        elapsed = time.monotonic() - start
        healthy = {n.info.node_id for n in c.membership.nodes()}
    assert elapsed < 3
    assert r.text.endswith("data: [DONE]\n\n") and '"node_failed"' in r.text
    assert "d0" not in healthy


@pytest.mark.parametrize(
    "decode", [{"token_delay_s": 0.3}, {"decode_status": 503}], ids=["slow", "always_busy"]
)
async def test_request_deadline_ends_generation_without_blaming_the_node(
    tokenizer: Tokenizer, script: list[int], decode: dict[str, Any]
) -> None:
    """A decode too slow for the deadline, or a decode pool busy until it: a timeout error
    ends the stream, and the decode is aborted or the untaken lease released."""
    nodes = _nodes(script, **decode)
    async with (
        fake_cluster(tokenizer, nodes, request_timeout_s=0.5) as c,
        httpx.AsyncClient() as client,
    ):
        r = await client.post(c.router_url + "/v1/chat/completions", json=CHAT | {"stream": True})
        assert {"d0"} <= {n.info.node_id for n in c.membership.nodes()}
        prefill, decode_node = c.nodes
        rid = prefill.prefills[0].request_id
        await _eventually(lambda: decode_node.aborts + prefill.releases == [rid])
    assert '"code":"timeout"' in r.text and r.text.endswith("data: [DONE]\n\n")
    assert r.text.count('"error"') == 1


def _errors(events: list[Any]) -> list[Any]:
    return [e["error"] for e in events if isinstance(e, dict) and "error" in e]


async def test_a_prefilled_request_waits_out_a_busy_decode_pool_and_finishes(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    """Both decode nodes answer 503 (batch and import queue full) three times each after
    token 1 went out: the stream waits for a place and finishes, with no error event."""
    nodes = [
        FakeNode("p0", "prefill", script),
        FakeNode("d0", "decode", script, busy_answers=3),
        FakeNode("d1", "decode", script, busy_answers=3),
    ]
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient() as client:
        body = CHAT | {"stream": True}
        async with client.stream("POST", c.router_url + "/v1/chat/completions", json=body) as r:
            events = await _sse(r)
        metrics = (await client.get(c.router_url + "/metrics")).text
        healthy = {n.info.node_id for n in c.membership.nodes()}
    assert _errors(events) == [] and events[-1] == "[DONE]"
    assert _chat_text(events) == ANSWER
    calls = [d for node in c.nodes[1:] for d in node.decodes]
    assert len(calls) == 7 and all(d.kv is not None for d in calls)  # the last one took it
    assert metric(metrics, "splitserve_router_decode_waits_total") == 3
    assert c.nodes[0].releases == []  # the lease went to the decode node
    assert {"d0", "d1"} <= healthy  # busy is no fault


async def test_a_lease_that_ends_while_the_decode_pool_is_busy_is_released_and_prefilled_again(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    """The KV lease has 0.3 s left past the slack the router keeps: once it is spent, the
    router releases the lease and the decode node prefills prompt + token 1 itself."""
    nodes = [
        FakeNode("p0", "prefill", script, lease_s=2.3),
        FakeNode("d0", "decode", script, busy_answers=6),
    ]
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient() as client:
        r = await client.post(c.router_url + "/v1/chat/completions", json=CHAT)
        metrics = (await client.get(c.router_url + "/metrics")).text
        prefill, decode = c.nodes
        await _eventually(lambda: prefill.releases == [prefill.prefills[0].request_id])
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ANSWER
    imports = [d for d in decode.decodes if d.kv is not None]
    assert imports and all(d.wait_s is not None and d.wait_s <= 0.3 for d in imports)
    last = decode.decodes[-1]
    assert last.kv is None and last.output_token_ids == script[:1]
    assert metric(metrics, "splitserve_router_local_prefill_total", reason="lease_ending") == 1


async def test_a_decode_node_may_hold_its_answer_while_the_import_waits_in_its_queue(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    """The node answers only after 1 s (queued for KV blocks), past the 0.5 s idle timeout:
    that is no silence, and the node is not marked unhealthy."""
    gate = asyncio.Event()
    async with (
        fake_cluster(tokenizer, _nodes(script, accept_gate=gate), decode_idle_timeout_s=0.5) as c,
        httpx.AsyncClient() as client,
    ):
        asyncio.get_running_loop().call_later(1.0, gate.set)
        r = await client.post(c.router_url + "/v1/chat/completions", json=CHAT)
        healthy = {n.info.node_id for n in c.membership.nodes()}
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ANSWER
    (call,) = c.nodes[1].decodes
    assert call.wait_s is not None and 20 < call.wait_s <= 28  # the lease's 30 s less slack
    assert "d0" in healthy
