"""The kv_aware policy's score: the prompt share a node already holds against its load.

    score = prefix * matched_tokens / prompt_tokens
            - load * (running + waiting + this router's in-flight requests)
            - kv_usage * kv_usage

The node with the highest score wins; ties rotate like the other policies. With the default
weights a node holding the whole prompt is worth five more queued requests than a node
holding none of it. The weights are router settings (kv_prefix_weight, kv_load_weight,
kv_usage_weight).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cluster.protocol import NodeRecord
from router.kv_index import PrefixIndex, PrefixQuery


@dataclass(frozen=True)
class KVWeights:
    prefix: float = 1.0
    load: float = 0.2
    kv_usage: float = 0.5

    def __post_init__(self) -> None:
        for name in ("prefix", "load", "kv_usage"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"KVWeights.{name} must be >= 0, got {value!r}")

    def score(self, hit_ratio: float, queued: int, kv_usage: float) -> float:
        return self.prefix * hit_ratio - self.load * queued - self.kv_usage * kv_usage


def kv_aware_choice(
    nodes: Sequence[NodeRecord],
    index: PrefixIndex,
    query: PrefixQuery,
    weights: KVWeights,
    queued: Callable[[NodeRecord], int],
) -> NodeRecord:
    """The best of `nodes` (non-empty, in rotation order: the first best wins ties)."""
    matched = index.matched_tokens(query, [n.info.node_id for n in nodes])
    total = max(len(query.token_ids), 1)

    def score(node: NodeRecord) -> float:
        hit = matched[node.info.node_id] / total
        return weights.score(hit, queued(node), node.load.kv_usage)

    return max(nodes, key=score)
