"""How many requests the cluster holds at once, from what its nodes report: the router's
admission limit follows it (router.admission)."""

from __future__ import annotations

from collections.abc import Iterable

from cluster.node_records import NodeRecord
from router.routing.policy import Pools


def pool_capacity(nodes: Iterable[NodeRecord]) -> int | None:
    """Requests the healthy pools hold at once: each node's batch (`max_num_seqs`) and the
    requests it lets wait for a place there (`max_queued`: a decode node's KV imports).

    None while that is unknown: no node decodes, or one reports no batch size (an older
    node); then the router's `max_inflight` alone bounds admission.
    """
    pools = Pools.of(nodes)
    counted = (*pools.prefill, *pools.local)
    if not pools.local or any(n.info.max_num_seqs == 0 for n in counted):
        return None
    return sum(n.info.max_num_seqs + n.info.max_queued for n in counted)
