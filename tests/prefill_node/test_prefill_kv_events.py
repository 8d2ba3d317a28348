"""A real prefill node publishes its prefix cache: the router's index, hashing the same token
ids on its own (models.block_hash), finds the node's blocks; evictions and the node's exit
take them away again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from node_harness import NUM_BLOCKS, node_settings, save_tiny_model, serving

from cluster.kv_event_reader import KVEventReader
from cluster.kv_events import stream_key
from launcher.redis_server import EmbeddedRedis
from prefill_node.app import create_app
from router.routing.prefix_index import PrefixIndex, PrefixQuery

PROMPT = [5, 9, 17, 33, 4, 8, 12, 40, 41, 3]  # 2 full blocks of 4, then 2 tokens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


async def _until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def _body(rid: str, prompt: list[int]) -> dict[str, object]:
    sampling = {"max_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    return {"request_id": rid, "prompt_token_ids": prompt, "sampling": sampling}


async def test_the_index_follows_a_real_prefill_node(model_dir: Path) -> None:
    with EmbeddedRedis() as server:
        settings = node_settings(model_dir, server.url, "prefill")
        node_id = settings.resolved_node_id()
        index = PrefixIndex()
        members = {node_id}
        reader = KVEventReader(server.url, index, lambda: members, block_s=0.05)
        await reader.start()
        query = PrefixQuery(PROMPT)
        try:
            async with serving(create_app(settings), settings) as node:
                resp = await node.post("/internal/prefill", json=_body("a", PROMPT))
                assert resp.status_code == 200, resp.text
                await node.post("/internal/release", json={"request_id": "a"})
                await _until(lambda: index.matched_tokens(query, [node_id])[node_id] == 8)
                # Fill the cache with other prompts: every block of PROMPT gets evicted.
                for i in range(NUM_BLOCKS // 4):
                    other = [50 + i] * 16
                    resp = await node.post("/internal/prefill", json=_body(f"o{i}", other))
                    assert resp.status_code == 200, resp.text
                    await node.post("/internal/release", json={"request_id": f"o{i}"})
                await _until(lambda: index.matched_tokens(query, [node_id])[node_id] == 0)
                assert index.num_blocks([node_id]) > 0
            client = aioredis.Redis.from_url(server.url)
            assert not await client.exists(stream_key(node_id))  # deleted at the node's exit
            await client.aclose()
            members.clear()  # the membership forgets the node
            await _until(lambda: index.nodes() == [])
        finally:
            await reader.stop()
