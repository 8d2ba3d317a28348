"""The router follows membership in a real (embedded) Redis and keeps serving without it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest
from router_fakes import ANSWER, FakeNode, router_settings, serving

from cluster.node_records import NodeLoad
from cluster.registry import NodeRegistry
from launcher.redis_server import EmbeddedRedis
from models.tokenizer import Tokenizer
from router.app import create_app

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Capital of France?"}]}
pytestmark = pytest.mark.timeout(60)


async def _eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_router_discovers_nodes_in_redis_and_survives_its_outage(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    with EmbeddedRedis() as redis_server:
        settings = router_settings(redis_url=redis_server.url, membership_poll_s=0.05)
        app = create_app(settings, tokenizer=tokenizer)
        async with (
            serving(nodes[0].app()) as p_url,
            serving(nodes[1].app()) as d_url,
            serving(app, lifespan="on") as url,
            httpx.AsyncClient() as client,
        ):
            assert (await client.get(url + "/ready")).status_code == 503
            registries = []
            for node, node_url in zip(nodes, (p_url, d_url), strict=True):
                node.url = node_url
                registry = NodeRegistry(redis_server.url, ttl_s=5.0)
                await registry.register(node.record().info, NodeLoad())
                registries.append(registry)
            await _eventually(lambda: len(app.state.router.membership.nodes()) == 2)
            assert (await client.get(url + "/ready")).status_code == 200
            first = await client.post(url + "/v1/chat/completions", json=CHAT)

            redis_server.stop()  # Redis dies: the last known membership keeps serving
            await _eventually(lambda: not app.state.router.membership.redis_ok)
            second = await client.post(url + "/v1/chat/completions", json=CHAT)
            for registry in registries:
                await registry.close()
    assert first.status_code == 200 and second.status_code == 200
    assert second.json()["choices"][0]["message"]["content"] == ANSWER
