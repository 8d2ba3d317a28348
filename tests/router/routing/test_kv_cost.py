"""kv_aware: the node that caches the prompt's prefix wins until its load outweighs the
prefix; the router's flow sends the prefill there and counts predicted and actual hits."""

from __future__ import annotations

import httpx
import pytest
from router_fakes import FakeNode, fake_cluster, metric

from cluster.kv_events import KVEventMsg
from cluster.node_records import NodeInfo, NodeLoad, NodeRecord
from models.block_hash import prefix_block_hashes
from models.tokenizer import Tokenizer
from router.routing.kv_cost import WORK_SMOOTHING, KVWeights, PoolWork, kv_aware_choice
from router.routing.policy import NodePicker
from router.routing.prefix_index import PrefixIndex, PrefixQuery

PROMPT = list(range(1000, 1040))  # 40 tokens: 2 full blocks of 16 and a partial one


def _node(node_id: str, running: int = 0) -> NodeRecord:
    info = NodeInfo(
        node_id=node_id, role="prefill", url="http://x", model="m", layout_fingerprint="fp",
        max_model_len=2048, capacity=10, started_at=0.0,
    )  # fmt: skip
    return NodeRecord(info=info, load=NodeLoad(running=running), heartbeat_at=0.0)


def _holds(index: PrefixIndex, node_id: str, tokens: list[int]) -> None:
    hashes = prefix_block_hashes(tokens, 16)
    stored = [(h, p) for p, h in zip([None, *hashes[:-1]], hashes, strict=True)]
    index.apply(
        KVEventMsg(node_id=node_id, incarnation="i", seq=1, snapshot=True, block_size=16,
                   stored=stored)
    )  # fmt: skip


def test_the_holder_wins_while_its_queue_costs_less_than_it_saves() -> None:
    index = PrefixIndex()
    _holds(index, "b", PROMPT)
    query = PrefixQuery(PROMPT)
    assert index.matched_tokens(query, ["a", "b"]) == {"a": 0, "b": 32}
    weights, work = KVWeights(prefix=1.0, load=1.0, kv_usage=0.0), PoolWork({"prefill": 10.0})

    def choice(b_running: int) -> str:
        nodes = [_node("a"), _node("b", running=b_running)]
        return kv_aware_choice("prefill", nodes, index, query, weights, work, queued).info.node_id

    def queued(node: NodeRecord) -> int:
        return node.load.running

    # b saves 32 of the 40 tokens; each queued request there costs the pool's average work
    assert choice(b_running=3) == "b"  # 8 + 3 * 10 < 40
    assert work.of("prefill") == 10.0 + WORK_SMOOTHING * (8 - 10.0)  # it learns b's 8 tokens
    work.tokens["prefill"] = 10.0
    assert choice(b_running=4) == "a"  # 8 + 4 * 10 > 40


def test_kv_aware_without_a_match_is_least_loaded() -> None:
    index = PrefixIndex()
    _holds(index, "b", PROMPT)
    picker = NodePicker("kv_aware", index)
    nodes = [_node("a"), _node("b", running=1)]
    other = PrefixQuery(list(range(5000, 5040)))  # cached nowhere
    assert [picker.pick("prefill", nodes, query=other).info.node_id for _ in range(2)] == ["a"] * 2
    assert picker.pick("prefill", nodes).info.node_id == "a"  # no query at all
    idle = [_node("a"), _node("b")]
    assert picker.pick("prefill", idle, query=PrefixQuery(PROMPT)).info.node_id == "b"


async def test_the_router_prefills_where_the_prefix_is_and_counts_hits(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = [
        FakeNode("p0", "prefill", script),
        FakeNode("p1", "prefill", script),
        FakeNode("d0", "decode", script, prefix_hit_tokens=16),
        FakeNode("d1", "decode", script),
    ]
    async with fake_cluster(tokenizer, nodes, policy="kv_aware") as c:
        _holds(c.app.state.router.kv.index, "p1", PROMPT)
        _holds(c.app.state.router.kv.index, "d0", PROMPT[:16])
        body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 3, "temperature": 0}
        async with httpx.AsyncClient(base_url=c.router_url) as client:
            for _ in range(4):
                resp = await client.post("/v1/completions", json=body)
                assert resp.status_code == 200, resp.text
            text = (await client.get("/metrics")).text
    assert (len(nodes[0].prefills), len(nodes[1].prefills)) == (0, 4)
    assert (len(nodes[2].decodes), len(nodes[3].decodes)) == (4, 0)  # d0 holds a block
    labels = {"pool": "prefill", "target": "p1", "policy": "kv_aware"}
    assert metric(text, "splitserve_router_kv_predicted_hit_tokens_total", **labels) == 4 * 32
    assert metric(text, "splitserve_router_kv_actual_hit_tokens_total", **labels) == 4 * 3
    # the decode node's own hits after each import: what it did not have to read
    labels = {"pool": "decode", "target": "d0", "policy": "kv_aware"}
    assert metric(text, "splitserve_router_kv_predicted_hit_tokens_total", **labels) == 4 * 16
    assert metric(text, "splitserve_router_kv_actual_hit_tokens_total", **labels) == 4 * 16
    routed = "splitserve_router_kv_routed_requests_total"
    for pool in ("prefill", "decode"):
        assert metric(text, routed, pool=pool, match="longest") == 4
        assert metric(text, routed, pool=pool, match="shorter") == 0
    assert metric(text, "splitserve_router_kv_index_blocks", pool="prefill") == 2


async def test_round_robin_is_counted_when_it_misses_the_longest_prefix(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = [
        FakeNode("p0", "prefill", script),
        FakeNode("p1", "prefill", script),
        FakeNode("d0", "decode", script),
    ]
    async with fake_cluster(tokenizer, nodes, policy="round_robin") as c:
        _holds(c.app.state.router.kv.index, "p1", PROMPT)
        body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 3, "temperature": 0}
        async with httpx.AsyncClient(base_url=c.router_url) as client:
            for _ in range(4):
                resp = await client.post("/v1/completions", json=body)
                assert resp.status_code == 200, resp.text
            text = (await client.get("/metrics")).text
    assert (len(nodes[0].prefills), len(nodes[1].prefills)) == (2, 2)
    routed = "splitserve_router_kv_routed_requests_total"
    assert metric(text, routed, pool="prefill", policy="round_robin", match="longest") == 2
    assert metric(text, routed, pool="prefill", policy="round_robin", match="shorter") == 2
    assert metric(text, routed, pool="decode", match="none") == 4  # d0 published nothing


def _event(node_id: str, seq: int, **changes: object) -> KVEventMsg:
    return KVEventMsg(node_id=node_id, incarnation="i", seq=seq, block_size=16, **changes)  # type: ignore[arg-type]


def test_a_lower_tier_hit_is_priced_between_a_device_hit_and_a_miss() -> None:
    index = PrefixIndex()
    hashes = prefix_block_hashes(PROMPT, 16)
    chain = list(zip(hashes, [None, *hashes[:-1]], strict=True))
    index.apply(_event("device", 1, snapshot=True, stored=chain))
    index.apply(_event("host", 1, snapshot=True, lower=[(h, p, "host") for h, p in chain]))
    index.apply(_event("disk", 1, snapshot=True, lower=[(h, p, "disk") for h, p in chain]))
    query = PrefixQuery(PROMPT)
    names = ["miss", "disk", "host", "device"]
    assert index.matched_tokens(query, names) == {"miss": 0, "disk": 32, "host": 32, "device": 32}
    tiers = index.matched_tiers(query, names)
    assert tiers == {
        "miss": {},
        "disk": {"disk": 32},
        "host": {"host": 32},
        "device": {"device": 32},
    }
    weights = KVWeights(load=0.0, kv_usage=0.0)
    costs = [weights.compute(len(PROMPT), tiers[n]) for n in names]
    assert costs == sorted(costs, reverse=True) and len(set(costs)) == 4  # miss > disk > ...
    choice = kv_aware_choice(
        "prefill", [_node(n) for n in names], index, query, weights, PoolWork(), lambda _: 0
    )
    assert choice.info.node_id == "device"
    # the host node loads the first block back onto its device; then loses the second
    index.apply(_event("host", 2, stored=[chain[0]]))
    index.apply(_event("host", 3, removed=[hashes[1]]))
    assert index.matched_tiers(query, ["host"]) == {"host": {"device": 16}}


@pytest.mark.parametrize("bad", [{"host": -0.1}, {"disk": 1.5}])
def test_lower_tier_prices_must_lie_between_a_hit_and_a_miss(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        KVWeights(**bad)
