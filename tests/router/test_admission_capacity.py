"""What the router's admission limit follows: the requests the pools report they hold."""

from __future__ import annotations

from cluster.node_records import NodeInfo, NodeRecord
from cluster.protocol import NodeRole
from router.capacity import pool_capacity


def _node(node_id: str, role: NodeRole, max_num_seqs: int, max_queued: int = 0) -> NodeRecord:
    info = NodeInfo(
        node_id=node_id, role=role, url="http://n", model="m", layout_fingerprint="f",
        max_model_len=64, capacity=10, started_at=0.0, max_num_seqs=max_num_seqs,
        max_queued=max_queued,
    )  # fmt: skip
    return NodeRecord(info=info, heartbeat_at=0.0)


def test_each_node_counts_its_batch_and_its_queue() -> None:
    nodes = [_node("p0", "prefill", 4), _node("d0", "decode", 8, 8), _node("d1", "decode", 2, 1)]
    assert pool_capacity(nodes) == 4 + 16 + 3
    assert pool_capacity([_node("c0", "colocated", 4, 2)]) == 6


def test_unknown_without_a_decoding_node_or_with_a_node_that_reports_no_batch() -> None:
    assert pool_capacity([]) is None
    assert pool_capacity([_node("p0", "prefill", 4)]) is None
    assert pool_capacity([_node("p0", "prefill", 0), _node("d0", "decode", 8, 8)]) is None
