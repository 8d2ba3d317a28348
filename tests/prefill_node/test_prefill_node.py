"""The prefill node: token 1 plus a KV lease; every way a lease ends frees the blocks
(release, expiry); probes, registry record, stats, metrics and error answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import anyio.to_thread
import httpx
import pytest
import pytest_asyncio
import redis
import torch
from node_harness import (
    BLOCK_SIZE,
    NUM_BLOCKS,
    TINY,
    metric,
    node_settings,
    scrape,
    serving,
    stats,
    wait_idle,
)

from cluster.node_records import NodeRecord
from cluster.protocol import EmbedResponse, PrefillResponse
from cluster.registry import node_key
from cluster.version import build_info
from prefill_node.app import create_app, route_paths

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = [5, 9, 17, 33, 4, 8, 12, 40, 41]  # 9 tokens: 3 blocks of 4


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(model_dir: Path, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = node_settings(model_dir, redis_url, "prefill", lease_ttl_s=0.6)
    async with serving(create_app(settings), settings) as client:
        yield client


def _body(rid: str, max_tokens: int = 8, prompt: list[int] = PROMPT) -> dict[str, object]:
    sampling = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    return {"request_id": rid, "prompt_token_ids": prompt, "sampling": sampling}


async def _prefill(node: httpx.AsyncClient, rid: str, **kw: object) -> PrefillResponse:
    resp = await node.post("/internal/prefill", json=_body(rid, **kw))  # type: ignore[arg-type]
    assert resp.status_code == 200, resp.text
    return PrefillResponse.model_validate_json(resp.content)


async def test_prefill_pins_the_prompt_blocks_under_a_lease(node: httpx.AsyncClient) -> None:
    answer = await _prefill(node, "pin")
    assert not answer.finished and answer.kv is not None
    assert answer.num_prompt_tokens == len(PROMPT) == answer.kv.num_tokens
    assert len(answer.kv.block_ids) == 3
    now = await stats(node)
    assert now.load.leases_held == 1
    assert now.load.free_blocks == NUM_BLOCKS - 3
    assert answer.kv.layout_fingerprint == now.info.layout_fingerprint
    assert answer.kv.peer_info == now.info.peer_info


async def test_release_frees_the_blocks_once(node: httpx.AsyncClient) -> None:
    await _prefill(node, "rel", prompt=[7, 7, 7, 7, 7])
    first = await node.post("/internal/release", json={"request_id": "rel"})
    again = await node.post("/internal/release", json={"request_id": "rel"})
    assert first.json() == {"request_id": "rel", "done": True}
    assert again.json() == {"request_id": "rel", "done": False}
    idle = await wait_idle(node)
    assert idle.load.free_blocks == NUM_BLOCKS  # "pin" of the test above expired too


async def test_expired_lease_frees_the_blocks_through_the_engine(node: httpx.AsyncClient) -> None:
    await _prefill(node, "expire", prompt=[3, 1, 4, 1, 5, 9, 2, 6])
    assert (await stats(node)).load.leases_held == 1
    await asyncio.sleep(0.8)  # lease_ttl_s=0.6, leases checked every 20 ms
    idle = await stats(node)
    assert (idle.load.leases_held, idle.load.free_blocks) == (0, NUM_BLOCKS)
    assert idle.counters["leases_ended_total"] >= 1


async def test_request_done_at_the_first_token_holds_no_lease(node: httpx.AsyncClient) -> None:
    answer = await _prefill(node, "one", max_tokens=1)
    assert answer.finished and answer.kv is None and answer.finish_reason == "length"
    now = await stats(node)
    assert now.load.leases_held == 0 and now.load.free_blocks == NUM_BLOCKS


async def test_embed_answers_a_vector_and_keeps_no_block(node: httpx.AsyncClient) -> None:
    body = {"request_id": "emb", "prompt_token_ids": PROMPT, "pooling": "mean"}
    resp = await node.post("/internal/embed", json=body)
    assert resp.status_code == 200, resp.text
    answer = EmbedResponse.model_validate_json(resp.content)
    assert answer.num_prompt_tokens == len(PROMPT)
    assert abs(sum(x * x for x in answer.embedding) - 1.0) < 1e-4  # normalized
    now = await stats(node)
    assert (now.load.leases_held, now.load.free_blocks) == (0, NUM_BLOCKS)
    wide = await node.post("/internal/embed", json=body | {"dimensions": 3})
    bad = await node.post("/internal/embed", json=body | {"prompt_token_ids": [1, 10**6]})
    assert (wide.status_code, wide.json()["error"]["param"]) == (400, "dimensions")
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "prompt_token_ids")


@pytest.mark.timeout(60)
async def test_a_prefill_needs_no_worker_thread(node: httpx.AsyncClient) -> None:
    """The endpoint's checks are coroutines, not FastAPI thread-pool calls: a prefill is
    answered while every worker thread of the pool is taken."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    holders = [object() for _ in range(int(limiter.total_tokens))]
    for holder in holders:
        await limiter.acquire_on_behalf_of(holder)
    try:
        answer = await _prefill(node, "no-thread", max_tokens=1)
    finally:
        for holder in holders:
            limiter.release_on_behalf_of(holder)
    assert answer.finished and answer.finish_reason == "length"


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b""])
async def test_a_body_that_is_no_prefill_request_answers_400(
    node: httpx.AsyncClient, raw: bytes
) -> None:
    headers = {"content-type": "application/json"}
    resp = await node.post("/internal/prefill", content=raw, headers=headers)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "bad_request" and error["message"].startswith("invalid request")
    assert error["param"] is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_body("bad1", prompt=[]), "prompt_token_ids"),
        (_body("bad2", prompt=[999]), "prompt_token_ids"),
        (_body("bad3", prompt=[1] * 300), "prompt_token_ids"),
        ({"request_id": "bad4", "prompt_token_ids": [1]}, "sampling"),
        (
            {"request_id": "bad5", "prompt_token_ids": [1], "sampling": {"top_p": 0}},
            "sampling.top_p",
        ),
    ],
)
async def test_bad_requests_answer_400_and_hold_nothing(
    node: httpx.AsyncClient, body: dict[str, object], param: str
) -> None:
    resp = await node.post("/internal/prefill", json=body)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "bad_request" and error["param"] == param and error["message"]
    now = await stats(node)
    assert now.load.running == 0 and now.load.waiting == 0


async def test_ready_and_registered_in_redis(node: httpx.AsyncClient, redis_url: str) -> None:
    ready = await node.get("/ready")
    assert ready.status_code == 200 and ready.json()["registered"] is True
    assert ready.json()["serving"] is True
    assert (await node.get("/health")).status_code == 200
    info = (await stats(node)).info
    raw = redis.Redis.from_url(redis_url).get(node_key(info.node_id))
    assert raw is not None
    record = NodeRecord.model_validate_json(raw)
    assert record.info == info and record.info.role == "prefill"
    assert record.load.total_blocks == NUM_BLOCKS


async def test_version_names_the_package_python_and_torch(node: httpx.AsyncClient) -> None:
    resp = await node.get("/version")  # open, like the probes
    assert resp.status_code == 200
    assert resp.json() == {**build_info(), "torch": torch.__version__}
    assert build_info()["version"] != "unknown"


async def test_metrics_carry_role_and_node_labels(node: httpx.AsyncClient) -> None:
    text = (await node.get("/metrics")).text
    node_id = (await stats(node)).info.node_id
    for name in ("running_requests", "waiting_requests", "kv_usage_ratio"):
        assert f'splitserve_{name}{{node="{node_id}",role="prefill"}}' in text


async def test_stats_and_metrics_carry_the_kv_capacity(node: httpx.AsyncClient) -> None:
    info = (await stats(node)).info
    layers, kv_heads = TINY["num_hidden_layers"], TINY["num_key_value_heads"]
    head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]
    block_bytes = layers * 2 * BLOCK_SIZE * kv_heads * head_dim * 4  # fp32
    assert (info.capacity, info.kv_capacity_tokens) == (NUM_BLOCKS, NUM_BLOCKS * BLOCK_SIZE)
    assert info.kv_cache_bytes == NUM_BLOCKS * block_bytes
    samples = await scrape(node)
    labels = {"role": "prefill", "node": info.node_id}
    assert metric(samples, "splitserve_kv_capacity_blocks", **labels) == NUM_BLOCKS
    assert metric(samples, "splitserve_kv_capacity_tokens", **labels) == NUM_BLOCKS * BLOCK_SIZE
    assert metric(samples, "splitserve_kv_cache_bytes", **labels) == info.kv_cache_bytes


async def test_stats_name_the_model_its_layout_and_weights(node: httpx.AsyncClient) -> None:
    info = (await stats(node)).info
    hidden, inter, vocab = TINY["hidden_size"], TINY["intermediate_size"], TINY["vocab_size"]
    layers, kv = TINY["num_hidden_layers"], TINY["num_key_value_heads"] * hidden // 4
    per_layer = 2 * hidden + hidden * (2 * hidden + 2 * kv) + 3 * hidden * inter
    assert info.weight_bytes == 4 * (vocab * hidden + hidden + layers * per_layer)  # tied head
    assert info.expert_weight_bytes == 0  # a dense model
    assert info.architecture == "LlamaForCausalLM"
    assert f"layers={layers}" in info.layout and "windows=full" in info.layout


async def test_create_app_loads_nothing_and_serves_the_probe_paths(model_dir: Path) -> None:
    settings = node_settings(model_dir, "redis://127.0.0.1:1/0", "prefill")
    app = create_app(settings)
    assert app.state.node.runtime is None
    assert {"/health", "/ready", "/stats", "/metrics", "/internal/prefill"} <= route_paths()
    with pytest.raises(ValueError, match="role=prefill"):
        create_app(node_settings(model_dir, "redis://127.0.0.1:1/0", "decode"))


async def test_a_dead_engine_thread_fails_health_and_leaves_the_registry(
    model_dir: Path, redis_url: str
) -> None:
    settings = node_settings(model_dir, redis_url, "prefill")
    app = create_app(settings)
    store = redis.Redis.from_url(redis_url)
    async with serving(app, settings) as client:
        for _ in range(50):  # the first heartbeat registers the node
            if (await client.get("/ready")).status_code == 200:
                break
            await asyncio.sleep(0.05)
        assert (await client.get("/ready")).status_code == 200
        assert store.get(node_key(settings.resolved_node_id())) is not None
        await asyncio.to_thread(app.state.node.runtime.loop.stop)
        await asyncio.sleep(3 * settings.heartbeat_s)
        assert (await client.get("/health")).status_code == 503
        assert (await client.get("/ready")).status_code == 503
        assert store.get(node_key(settings.resolved_node_id())) is None
