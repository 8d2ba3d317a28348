"""Node choice: round robin, least loaded, exclusions, saturation, pools."""

from __future__ import annotations

from cluster.node_records import NodeInfo, NodeLoad, NodeRecord
from router.routing.policy import NodePicker, Pools, saturated


def _node(node_id: str, role: str = "decode", running: int = 0, waiting: int = 0,
          kv_usage: float = 0.0, max_model_len: int = 2048) -> NodeRecord:  # fmt: skip
    info = NodeInfo.model_validate(
        {"node_id": node_id, "role": role, "url": "http://x", "model": "m",
         "layout_fingerprint": "fp", "max_model_len": max_model_len, "capacity": 10,
         "started_at": 0.0}
    )  # fmt: skip
    load = NodeLoad(running=running, waiting=waiting, kv_usage=kv_usage)
    return NodeRecord(info=info, load=load, heartbeat_at=0.0)


def _ids(picks: list[NodeRecord | None]) -> list[str]:
    return [p.info.node_id if p else "-" for p in picks]


def test_round_robin_cycles_in_node_order_per_pool() -> None:
    picker = NodePicker("round_robin")
    nodes = [_node("b"), _node("a"), _node("c")]
    assert _ids([picker.pick("decode", nodes) for _ in range(4)]) == ["a", "b", "c", "a"]
    assert _ids([picker.pick("prefill", nodes)]) == ["a"]  # pools turn independently


def test_round_robin_skips_excluded_nodes() -> None:
    picker = NodePicker("round_robin")
    nodes = [_node("a"), _node("b")]
    assert _ids([picker.pick("d", nodes, exclude={"a"}) for _ in range(2)]) == ["b", "b"]
    assert picker.pick("d", nodes, exclude={"a", "b"}) is None
    assert picker.pick("d", []) is None


def test_least_loaded_prefers_the_idle_node() -> None:
    picker = NodePicker("least_loaded")
    nodes = [_node("busy", running=5, waiting=2), _node("idle", running=1)]
    assert _ids([picker.pick("decode", nodes) for _ in range(3)]) == ["idle"] * 3


def test_least_loaded_counts_this_routers_inflight_requests() -> None:
    picker = NodePicker("least_loaded")
    nodes = [_node("a"), _node("b")]  # equal heartbeats
    first = picker.pick("decode", nodes)
    assert first is not None
    picker.begin(first.info.node_id)
    second = picker.pick("decode", nodes)
    assert second is not None and second.info.node_id != first.info.node_id
    picker.end(first.info.node_id)
    assert picker.inflight(first.info.node_id) == 0


def test_least_loaded_breaks_ties_on_kv_usage() -> None:
    picker = NodePicker("least_loaded")
    nodes = [_node("full", kv_usage=0.9), _node("empty", kv_usage=0.1)]
    assert _ids([picker.pick("decode", nodes) for _ in range(2)]) == ["empty", "empty"]


def test_saturation_needs_every_node_at_the_limit() -> None:
    assert saturated([_node("a", waiting=4), _node("b", waiting=5)], max_queue=4)
    assert not saturated([_node("a", waiting=4), _node("b", waiting=3)], max_queue=4)
    assert not saturated([], max_queue=4)


def test_pools_readiness_and_context_length() -> None:
    prefill, decode = _node("p", "prefill", max_model_len=512), _node("d", "decode")
    colocated = _node("c", "colocated", max_model_len=1024)
    assert Pools.of([prefill, decode]).ready
    assert not Pools.of([prefill]).ready and not Pools.of([decode]).ready
    assert Pools.of([colocated]).ready
    pools = Pools.of([prefill, decode, colocated])
    assert [n.info.node_id for n in pools.local] == ["d", "c"]
    assert pools.max_model_len() == 512
    assert Pools.of([]).max_model_len() is None
