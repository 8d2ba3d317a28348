"""The router's view of where KV lives: the prefix index, the reader of the nodes' KV event
streams that feeds it, and the metrics that judge it (predicted against actual prefix hits,
index size, event lag). The index runs under every policy, so the metrics compare them; only
kv_aware routes by it."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from cluster.kv_event_reader import KVEventReader
from cluster.registry import Membership, StaticMembership
from router.metrics import KVMetrics
from router.routing.prefix_index import PrefixIndex, PrefixQuery

POOLS = ("prefill", "decode", "colocated")


class KVRouting:
    def __init__(self, policy: str, metrics: KVMetrics, membership: StaticMembership) -> None:
        self.index = PrefixIndex()
        self.policy = policy
        self._metrics = metrics
        self._membership = membership
        self._reader: KVEventReader | None = None
        for pool in POOLS:
            metrics.index_blocks.labels(pool).set_function(functools.partial(self._blocks, pool))

    async def start(self, redis_url: str) -> None:
        """Follow the KV events of every node the membership knows (with Redis only)."""
        members = self._membership
        if not isinstance(members, Membership):
            return
        self._reader = KVEventReader(
            redis_url, self.index, self._node_ids, namespace=members.namespace,
            on_lag=self._metrics.event_lag.observe,
        )  # fmt: skip
        await self._reader.start()

    async def stop(self) -> None:
        if self._reader is not None:
            await self._reader.stop()
            self._reader = None

    def predicted(self, query: PrefixQuery, node_id: str) -> int:
        """Prompt tokens the index expects `node_id` to hold."""
        return self.index.matched_tokens(query, [node_id])[node_id]

    def routed(self, pool: str, query: PrefixQuery, node_id: str, candidates: Sequence[str]) -> int:
        """`node_id` of `candidates` was chosen for `pool`: count whether it held the longest
        cached prefix among them (as the index says); returns its predicted hit tokens."""
        matched = self.index.matched_tokens(query, [*candidates, node_id])
        longest = max(matched.values())
        match = "none" if longest == 0 else "longest" if matched[node_id] == longest else "shorter"
        self._metrics.routed.labels(pool, self.policy, match).inc()
        return matched[node_id]

    def record(self, pool: str, node_id: str, predicted: int, actual: int) -> None:
        """A node chosen for `pool` reported `actual` prompt tokens from its cache."""
        self._metrics.predicted_hit_tokens.labels(pool, node_id, self.policy).inc(predicted)
        self._metrics.actual_hit_tokens.labels(pool, node_id, self.policy).inc(actual)

    def _node_ids(self) -> Sequence[str]:
        return [r.info.node_id for r in self._membership.all_nodes()]

    def _blocks(self, pool: str) -> int:
        records = self._membership.all_nodes()
        return self.index.num_blocks(r.info.node_id for r in records if r.info.role == pool)
