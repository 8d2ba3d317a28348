"""Which node gets a request: round robin, least loaded, or kv_aware (router.routing.kv_cost).

Least loaded scores a node by running + waiting requests from its last heartbeat plus the
requests this router has in flight on it (heartbeats are up to a second old, so a burst
would otherwise all land on one node); ties go to the lower KV usage, then rotate.
kv_aware weighs load against the prompt tokens a node would not have to compute, as the
prefix index says (router.routing.kv_cost); without a prompt to match it is least loaded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from cluster.node_records import NodeRecord
from router.routing.kv_cost import Cost, KVWeights, PoolWork, kv_aware_choice, kv_costs
from router.routing.prefix_index import PrefixIndex, PrefixQuery

Policy = Literal["round_robin", "least_loaded", "kv_aware"]
POLICIES: tuple[Policy, ...] = ("round_robin", "least_loaded", "kv_aware")


class NodePicker:
    """Picks nodes per pool ("prefill", "decode", ...) and counts this router's in-flight work."""

    def __init__(
        self,
        policy: Policy,
        index: PrefixIndex | None = None,
        weights: KVWeights | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        self.index = index if index is not None else PrefixIndex()
        self.weights = weights or KVWeights()
        self._work = PoolWork()
        self._turn: Counter[str] = Counter()
        self._inflight: Counter[str] = Counter()

    def pick(
        self,
        pool: str,
        candidates: Sequence[NodeRecord],
        exclude: Collection[str] = (),
        query: PrefixQuery | None = None,
    ) -> NodeRecord | None:
        """A node of `candidates` not in `exclude`, or None when none is left. `query`: the
        request's token ids, for kv_aware."""
        nodes = sorted(
            (c for c in candidates if c.info.node_id not in exclude), key=lambda c: c.info.node_id
        )
        if not nodes:
            return None
        turn = self._turn[pool]
        self._turn[pool] += 1
        rotated = nodes[turn % len(nodes) :] + nodes[: turn % len(nodes)]
        if self.policy == "round_robin":
            return rotated[0]
        if self.policy == "kv_aware" and query is not None and len(rotated) > 1:
            return kv_aware_choice(
                pool, rotated, self.index, query, self.weights, self._work, self._queued
            )
        return min(rotated, key=self._score)

    def costs(
        self, pool: str, candidates: Sequence[NodeRecord], query: PrefixQuery
    ) -> dict[str, Cost]:
        """Each candidate's kv_aware cost and its terms, whatever the policy (for traces)."""
        return kv_costs(pool, candidates, self.index, query, self.weights, self._work, self._queued)

    def _queued(self, node: NodeRecord) -> int:
        """Requests at the node: its heartbeat's, or more when this router sent more since."""
        return max(node.load.running + node.load.waiting, self._inflight[node.info.node_id])

    def _score(self, node: NodeRecord) -> tuple[int, float]:
        load = node.load
        return load.running + load.waiting + self._inflight[node.info.node_id], load.kv_usage

    def begin(self, node_id: str) -> None:
        """This router sent a request to `node_id`."""
        self._inflight[node_id] += 1

    def end(self, node_id: str) -> None:
        """That request is over."""
        self._inflight[node_id] -= 1
        if self._inflight[node_id] <= 0:
            del self._inflight[node_id]

    def inflight(self, node_id: str) -> int:
        return self._inflight[node_id]


def saturated(candidates: Sequence[NodeRecord], max_queue: int) -> bool:
    """True when every candidate reports a waiting queue of at least `max_queue`."""
    return bool(candidates) and all(c.load.waiting >= max_queue for c in candidates)


@dataclass(frozen=True)
class Pools:
    """Healthy nodes by role. Decode and colocated nodes can both prefill locally."""

    prefill: tuple[NodeRecord, ...]
    decode: tuple[NodeRecord, ...]
    colocated: tuple[NodeRecord, ...]

    @classmethod
    def of(cls, nodes: Iterable[NodeRecord]) -> Pools:
        nodes = list(nodes)
        return cls(
            prefill=tuple(n for n in nodes if n.info.role == "prefill"),
            decode=tuple(n for n in nodes if n.info.role == "decode"),
            colocated=tuple(n for n in nodes if n.info.role == "colocated"),
        )

    @property
    def local(self) -> tuple[NodeRecord, ...]:
        """Nodes that take a DecodeRequest without a KV handle."""
        return self.decode + self.colocated

    @property
    def ready(self) -> bool:
        """A prefill and a decode node, or a colocated node."""
        return bool(self.prefill and self.decode) or bool(self.colocated)

    def max_model_len(self) -> int | None:
        """The smallest context length among the nodes (None without nodes)."""
        lens = [n.info.max_model_len for n in self.prefill + self.local]
        return min(lens) if lens else None
