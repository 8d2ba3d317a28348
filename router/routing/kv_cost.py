"""The kv_aware policy's cost, in prompt tokens of prefill work (the lowest wins):

    cost = prefix * (prompt tokens the node must compute, given what it caches)
           + work * (load * queued requests + kv_usage * KV usage)

A cached token counts as computed in part when the node holds it below the device: a host
memory hit costs `host` of a miss (a copy), a disk hit `disk` (a read and a copy), a device
hit nothing; so a lower-tier hit is priced between a device hit and a miss.

`queued` is the larger of the node's running + waiting (its last heartbeat) and this
router's requests in flight there (heartbeats are up to a second old). `work` is what one
request costs a node of the pool: a moving average of the tokens the requests routed there
had to compute, so a queued request weighs as much as the traffic makes it weigh (a chat
turn on a warm cache: tens of tokens; a long document: thousands). With the defaults a node
that saves a request more than its average work wins over a node one request less busy.
The weights are router settings (kv_prefix_weight, kv_load_weight, kv_usage_weight,
kv_host_weight, kv_disk_weight).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cluster.node_records import NodeRecord
from router.routing.prefix_index import PrefixIndex, PrefixQuery

WORK_SMOOTHING = 0.1  # weight of the latest request in the moving average
INITIAL_WORK = 256.0  # tokens per request before any was routed


@dataclass(frozen=True)
class KVWeights:
    prefix: float = 1.0
    load: float = 0.5
    kv_usage: float = 0.5
    host: float = 0.1  # a token loaded from host memory, in tokens computed
    disk: float = 0.3  # a token loaded from disk

    def __post_init__(self) -> None:
        for name in ("prefix", "load", "kv_usage"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"KVWeights.{name} must be >= 0, got {value!r}")
        for name in ("host", "disk"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"KVWeights.{name} must be in [0, 1], got {value!r}")

    def compute(self, total: int, matched: dict[str, int]) -> float:
        """Tokens of prefill work left of `total` with `matched` tokens cached, by tier."""
        device = matched.get("device", 0)
        host, disk = matched.get("host", 0), matched.get("disk", 0)
        return total - device - (1 - self.host) * host - (1 - self.disk) * disk


@dataclass
class PoolWork:
    """Moving average of the prompt tokens a request had to compute, per pool."""

    tokens: dict[str, float] = field(default_factory=dict)

    def of(self, pool: str) -> float:
        return self.tokens.get(pool, INITIAL_WORK)

    def add(self, pool: str, computed: int) -> None:
        self.tokens[pool] = self.of(pool) + WORK_SMOOTHING * (computed - self.of(pool))


@dataclass(frozen=True)
class Cost:
    """One candidate's cost and its terms (a traced route decision shows them)."""

    compute: float  # prompt tokens to compute, cached tiers discounted
    queued: int
    kv_usage: float
    total: float
    cached: int  # prompt tokens the node holds, any tier

    def text(self) -> str:
        return (
            f"cost={self.total:.1f} compute={self.compute:.1f} queued={self.queued} "
            f"kv_usage={self.kv_usage:.3f} cached={self.cached}"
        )


def kv_costs(
    pool: str,
    nodes: Sequence[NodeRecord],
    index: PrefixIndex,
    query: PrefixQuery,
    weights: KVWeights,
    work: PoolWork,
    queued: Callable[[NodeRecord], int],
) -> dict[str, Cost]:
    """Each node's cost (by node id), and the tokens its prefix index matched."""
    matched = index.matched_tiers(query, [n.info.node_id for n in nodes])
    total, per_request = len(query.token_ids), work.of(pool)
    costs = {}
    for node in nodes:
        compute = weights.compute(total, matched[node.info.node_id])
        waiting, usage = queued(node), node.load.kv_usage
        busy = weights.load * waiting + weights.kv_usage * usage
        cost = weights.prefix * compute + per_request * busy
        cached = sum(matched[node.info.node_id].values())
        costs[node.info.node_id] = Cost(compute, waiting, usage, cost, cached)
    return costs


def kv_aware_choice(
    pool: str,
    nodes: Sequence[NodeRecord],
    index: PrefixIndex,
    query: PrefixQuery,
    weights: KVWeights,
    work: PoolWork,
    queued: Callable[[NodeRecord], int],
) -> NodeRecord:
    """The cheapest of `nodes` (non-empty, in rotation order: the first cheapest wins ties);
    the average work of `pool` learns the chosen node's tokens to compute."""
    costs = kv_costs(pool, nodes, index, query, weights, work, queued)
    best = min(nodes, key=lambda node: costs[node.info.node_id].total)
    work.add(pool, len(query.token_ids) - costs[best.info.node_id].cached)
    return best
