"""`splitserve up` with 2 prefill + 2 decode nodes under 50 concurrent streamed chats: all
complete with the offline engine's greedy text, every node takes part, and afterwards every
KV block is free and no lease is held on either side."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis
from cluster_harness import Cluster, running_cluster
from oracle import Oracle

from cluster.kv_events import FIELD, KVEventMsg, stream_key
from models.block_hash import prefix_block_hashes

pytestmark = pytest.mark.e2e

NUM_REQUESTS = 50
MAX_TOKENS = 8
DISTINCT = [
    [{"role": "user", "content": f"Write one short sentence about the number {i}."}]
    for i in range(10)
]
CHATS = [DISTINCT[i % len(DISTINCT)] for i in range(NUM_REQUESTS)]  # repeats hit prefix caches


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("up-2x2")
    args = ("--prefill", "2", "--decode", "2", "--num-kv-blocks", "256")
    with running_cluster(default_model_dir, run_dir, *args, check_clean_exit=True) as up:
        yield up


async def _stream(client: openai.AsyncOpenAI, model: str, chat: list[dict[str, str]]) -> str:
    stream = await client.chat.completions.create(
        model=model, messages=chat, max_tokens=MAX_TOKENS, temperature=0,  # type: ignore[arg-type]
        stream=True,
    )  # fmt: skip
    text = ""
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    return text


async def _all(base_url: str) -> list[str]:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    async with client:
        model = (await client.models.list()).data[0].id
        return await asyncio.gather(*(_stream(client, model, chat) for chat in CHATS))


def test_concurrent_streams_match_and_leave_nothing_behind(
    cluster: Cluster, oracle: Oracle
) -> None:
    distinct = [e.text for e in oracle.chat(DISTINCT, max_tokens=MAX_TOKENS)]
    expected = [distinct[i % len(DISTINCT)] for i in range(NUM_REQUESTS)]
    texts = asyncio.run(asyncio.wait_for(_all(cluster.base_url), 300))
    assert texts == expected
    prefill, decode = cluster.node_names("prefill"), cluster.node_names("decode")
    idle = cluster.wait_idle(prefill + decode)
    for name, stats in idle.items():
        load = stats.load
        assert (load.free_blocks, load.leases_held, load.running) == (load.total_blocks, 0, 0), name
    assert all(idle[n].counters.get("leases_granted_total", 0) > 0 for n in prefill)
    assert all(idle[n].counters.get("imports_total", 0) > 0 for n in decode)
    assert sum(idle[n].counters["imports_total"] for n in decode) == NUM_REQUESTS
    assert sum(idle[n].counters.get("transfer_failures_total", 0) for n in decode) == 0


def _router_metric(cluster: Cluster, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(cluster.base_url + "/metrics", timeout=10, trust_env=False).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and set(labels.items()) <= set(s.labels.items())
    )


def test_a_stale_index_entry_costs_a_miss_not_a_wrong_answer(
    cluster: Cluster, oracle: Oracle
) -> None:
    """The router's index claims a prefill node holds a prompt it never saw (what a lost
    eviction event leaves behind): the request goes there and still gets the right answer."""
    chat = [{"role": "user", "content": "List three colours of the rainbow, one per line."}]
    ids = oracle.llm.tokenizer.apply_chat_template(chat, True)
    hashes = prefix_block_hashes(ids, 16)
    victim = cluster.node_names("prefill")[0]
    lag = "splitserve_router_kv_event_lag_seconds_count"
    applied = _router_metric(cluster, lag)
    forged = KVEventMsg(
        node_id=victim, incarnation="forged", seq=1, snapshot=True, block_size=16,
        stored=[(h, None) for h in hashes], sent_at=time.time(),
    )  # fmt: skip
    client = redis.Redis.from_url(cluster.layout["redis"])
    client.xadd(stream_key(victim), {FIELD: forged.model_dump_json()})
    client.close()
    deadline = time.monotonic() + 30
    while _router_metric(cluster, lag) <= applied:  # the idle cluster publishes nothing else
        assert time.monotonic() < deadline, "the router never applied the forged event"
        time.sleep(0.05)
    labels = {"pool": "prefill", "target": victim}
    before = [
        _router_metric(cluster, f"splitserve_router_kv_{kind}_hit_tokens_total", **labels)
        for kind in ("predicted", "actual")
    ]
    answer = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused").chat.completions
    reply = answer.create(model="smollm2", messages=chat, max_tokens=MAX_TOKENS, temperature=0)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == oracle.chat([chat], max_tokens=MAX_TOKENS)[0].text
    predicted, actual = (
        _router_metric(cluster, f"splitserve_router_kv_{kind}_hit_tokens_total", **labels) - b
        for kind, b in zip(("predicted", "actual"), before, strict=True)
    )
    assert predicted == min(len(hashes), (len(ids) - 1) // 16) * 16  # routed by the claim
    assert actual < predicted  # the node computed what it did not have
