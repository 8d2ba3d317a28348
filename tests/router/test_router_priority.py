"""The request's `priority` reaches both nodes; its `timeout` shortens the deadline (408 when
it runs out) and bounds how long a decode node may queue the request."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from router_fakes import FakeNode, fake_cluster

from models.tokenizer import Tokenizer

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Capital of France?"}]}
pytestmark = pytest.mark.timeout(60)


async def test_priority_and_the_wait_reach_the_nodes(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient() as client:
        body = CHAT | {"priority": -3, "timeout": 20}
        resp = await client.post(c.router_url + "/v1/chat/completions", json=body)
    assert resp.status_code == 200
    assert nodes[0].prefills[0].priority == -3
    decode = nodes[1].decodes[0]
    assert decode.priority == -3 and decode.wait_s is not None and 0 < decode.wait_s <= 20


async def test_a_request_past_its_own_timeout_gets_408(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    gate = asyncio.Event()  # the decode never produces a token
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script, gate=gate)]
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient(timeout=10) as client:
        resp = await client.post(
            c.router_url + "/v1/chat/completions", json=CHAT | {"timeout": 0.5}
        )
        gate.set()
    assert resp.status_code == 408
    assert resp.json()["error"] | {"message": ""} == {
        "message": "", "type": "invalid_request_error", "param": "timeout", "code": "timeout",
    }  # fmt: skip
    assert nodes[1].aborts == [nodes[1].decodes[0].request_id]  # the decode was stopped


@pytest.mark.parametrize("bad", [{"priority": 10**7}, {"priority": "high"}, {"timeout": 0}])
async def test_bad_priority_or_timeout_is_a_400(
    tokenizer: Tokenizer, script: list[int], bad: dict[str, object]
) -> None:
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    async with fake_cluster(tokenizer, nodes) as c, httpx.AsyncClient() as client:
        resp = await client.post(c.router_url + "/v1/chat/completions", json=CHAT | bad)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == next(iter(bad))
    assert not nodes[0].prefills
