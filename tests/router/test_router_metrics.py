"""The router's /metrics agree with the requests a client made and the usage it was told."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from router_fakes import FakeNode, fake_cluster, metric

from launcher.redis_server import EmbeddedRedis
from models.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(60)


async def _stream_usage(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Any:
    """Stream one request; the usage of its last chunk."""
    usage = None
    async with client.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[len("data: ") :]).get("usage") or usage
    return usage


async def test_counters_and_histograms_agree_with_the_client(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    max_tokens = [3, 5, 7, 100]  # the last stops at the script's end (EOS)
    usages = []
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient() as client:
        url = c.router_url + "/v1/chat/completions"
        for i, n in enumerate(max_tokens):
            body = {
                "model": "smollm2",
                "messages": [{"role": "user", "content": f"Question {i}?"}],
                "max_tokens": n,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            usages.append(await _stream_usage(client, url, body))
        bad = await client.post(url, json={"model": "smollm2", "messages": []})
        assert bad.status_code == 400
        text = (await client.get(c.router_url + "/metrics")).text
    assert [u["completion_tokens"] for u in usages] == [3, 5, 7, len(script)]
    n = len(max_tokens)
    route = "/v1/chat/completions"
    assert metric(text, "splitserve_router_requests_total", route=route, status="200") == n
    assert metric(text, "splitserve_router_requests_total", route=route, status="400") == 1
    # the scrape itself is counted once answered, after its text was rendered
    assert metric(text, "splitserve_router_requests_total", role="router") == n + 1
    assert metric(text, "splitserve_router_ttft_seconds_count") == n
    assert metric(text, "splitserve_router_e2e_seconds_count") == n
    completion = sum(u["completion_tokens"] for u in usages)
    assert metric(text, "splitserve_router_itl_seconds_count") == completion - n
    assert metric(text, "splitserve_router_prompt_tokens_total") == sum(
        u["prompt_tokens"] for u in usages
    )
    assert metric(text, "splitserve_router_completion_tokens_total") == completion
    assert metric(text, "splitserve_router_inflight_requests") == 0
    assert metric(text, "splitserve_router_local_prefill_total") == 0


async def test_local_prefill_decisions_are_counted_by_reason(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    async with (
        fake_cluster(tokenizer, nodes, local_prefill_max_tokens=10_000) as c,
        httpx.AsyncClient() as client,
    ):
        body = {"model": "smollm2", "prompt": "Hi", "max_tokens": 2}
        for _ in range(2):
            r = await client.post(c.router_url + "/v1/completions", json=body)
            assert r.status_code == 200, r.text
        text = (await client.get(c.router_url + "/metrics")).text
    assert nodes[0].prefills == []
    counted = metric(text, "splitserve_router_local_prefill_total", reason="short_prompt")
    assert counted == 2
    assert metric(text, "splitserve_router_ttft_seconds_count", role="router") == 2


async def test_unknown_fields_are_logged_by_name_and_counted(
    tokenizer: Tokenizer, script: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """Fields the router does not know are ignored, but not silently: their names (never a
    value) go to the log, their count to /metrics, nested ones named by where they came."""
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    secret = "a value that must never reach the log"
    chat = {
        "model": "smollm2", "max_tokens": 2, "store": secret, "metadata": {"k": secret},
        "messages": [{"role": "user", "content": "Hi", "audio": secret}],
    }  # fmt: skip
    plain = {"model": "smollm2", "prompt": "Hi", "max_tokens": 2, "suffix_x": secret}
    caplog.set_level("INFO", logger="splitserve.router")
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient() as client:
        r = await client.post(c.router_url + "/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        r = await client.post(c.router_url + "/v1/completions", json=plain)
        assert r.status_code == 200, r.text
        known = {k: v for k, v in plain.items() if k != "suffix_x"}
        r = await client.post(c.router_url + "/v1/completions", json=known)
        assert r.status_code == 200, r.text
        text = (await client.get(c.router_url + "/metrics")).text
    name = "splitserve_router_ignored_fields_total"
    assert metric(text, name, route="/v1/chat/completions") == 3
    assert metric(text, name, route="/v1/completions") == 1
    lines = [r.getMessage() for r in caplog.records if "ignored_fields" in r.getMessage()]
    assert lines == [
        "ignored_fields route=/v1/chat/completions count=3 fields=store,metadata,messages.audio",
        "ignored_fields route=/v1/completions count=1 fields=suffix_x",
    ]
    assert secret not in caplog.text


async def test_paths_with_parameters_count_under_their_route(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    with EmbeddedRedis() as redis:
        async with (
            fake_cluster(tokenizer, nodes, redis_url=redis.url) as c,
            httpx.AsyncClient(base_url=c.router_url) as client,
        ):
            assert (await client.get("/v1/responses/resp_1")).status_code == 404
            assert (await client.delete("/v1/responses/resp_2")).status_code == 404
            assert (await client.post("/v1/responses/resp_3/cancel")).status_code == 404
            assert (await client.get("/v1/nothing/here")).status_code == 404
            text = (await client.get("/metrics")).text
    one = "/v1/responses/{response_id}"
    assert metric(text, "splitserve_router_requests_total", route=one, status="404") == 2
    cancel = "/v1/responses/{response_id}/cancel"
    assert metric(text, "splitserve_router_requests_total", route=cancel, status="404") == 1
    assert metric(text, "splitserve_router_requests_total", route="other", status="404") == 1
