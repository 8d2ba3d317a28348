"""What the planner sees at one tick (`Scrape`: the registry's nodes and the metric samples)
and what it derives from two consecutive ticks (`Observation`: rates and latency quantiles
over the interval between them).

Counters are turned into increases the way Prometheus' `increase()` does: a series that
went down was reset (a restarted node or router) and counts from zero; a series that was
not there at the previous tick counts from the next one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from planner.config import POOLS

PROMPT_TOKENS = "splitserve_prompt_tokens_total"
NODE_REQUESTS = "splitserve_requests_total"
TTFT_BUCKETS = "splitserve_router_ttft_seconds_bucket"
ITL_BUCKETS = "splitserve_router_itl_seconds_bucket"
ROUTER_REQUESTS = "splitserve_router_ttft_seconds_count"
# every metric the planner reads from the cluster (the Prometheus source asks for these)
READS = (PROMPT_TOKENS, NODE_REQUESTS, TTFT_BUCKETS, ITL_BUCKETS, ROUTER_REQUESTS)


@dataclass(frozen=True)
class Sample:
    """One series' value: metric name (with `_total` / `_bucket`), labels, value."""

    name: str
    labels: Mapping[str, str]
    value: float

    def key(self) -> tuple[str, frozenset[tuple[str, str]]]:
        return self.name, frozenset(self.labels.items())


@dataclass(frozen=True)
class NodeView:
    """One node as the registry shows it (its latest heartbeat)."""

    node_id: str
    role: str
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0


@dataclass(frozen=True)
class Scrape:
    """One tick's input. `samples` is None when the metrics source could not be read."""

    at: float
    nodes: tuple[NodeView, ...]
    samples: tuple[Sample, ...] | None = ()

    def pool(self, role: str) -> list[NodeView]:
        return [n for n in self.nodes if n.role == role]


@dataclass(frozen=True)
class PoolObservation:
    """One pool over an interval: its nodes now, and the prompt tokens its nodes accepted."""

    replicas: int
    running: int
    waiting: int
    busiest: int  # the most requests running on one node of the pool
    tokens_per_s: float = 0.0
    tokens_per_request: float = 0.0  # 0 when no request came
    waiting_before: int = 0
    same_nodes: bool = True  # the pool had these nodes at the previous tick too


@dataclass(frozen=True)
class Observation:
    """Two ticks compared. Latency quantiles are None when no request finished the phase."""

    at: float
    dt: float
    pools: dict[str, PoolObservation] = field(default_factory=dict)
    ttft_s: float | None = None
    itl_s: float | None = None
    requests_per_s: float = 0.0


def increases(before: Iterable[Sample], after: Iterable[Sample], name: str) -> list[Sample]:
    """Per series of `name`: how much it grew between the two ticks (resets handled)."""
    old = {s.key(): s.value for s in before if s.name == name}
    out = []
    for s in after:
        if s.name != name or s.key() not in old:
            continue
        prev = old[s.key()]
        out.append(Sample(name, s.labels, s.value - prev if s.value >= prev else s.value))
    return out


def quantile(buckets: Mapping[float, float], q: float) -> float | None:
    """`histogram_quantile` over cumulative bucket counts {upper bound: count}: linear
    within the bucket; the last finite bound when it falls in +Inf; None without data."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


def _histogram(grown: list[Sample]) -> dict[float, float]:
    """Bucket increases summed over every router, by upper bound."""
    total: dict[float, float] = {}
    for s in grown:
        le = float(s.labels.get("le", "+Inf"))
        total[le] = total.get(le, 0.0) + s.value
    return total


def _pool(
    before: Scrape, after: Scrape, grown: list[Sample], role: str, dt: float
) -> PoolObservation:
    nodes = after.pool(role)
    ids = {n.node_id for n in nodes}
    mine = [s for s in grown if s.labels.get("node") in ids]
    tokens = sum(s.value for s in mine if s.name == PROMPT_TOKENS)
    requests = sum(s.value for s in mine if s.name == NODE_REQUESTS)
    return PoolObservation(
        replicas=len(nodes),
        running=sum(n.running for n in nodes),
        waiting=sum(n.waiting for n in nodes),
        busiest=max((n.running for n in nodes), default=0),
        tokens_per_s=tokens / dt,
        tokens_per_request=tokens / requests if requests > 0 else 0.0,
        waiting_before=sum(n.waiting for n in before.pool(role)),
        same_nodes=ids == {n.node_id for n in before.pool(role)},
    )


def observe(before: Scrape, after: Scrape, q: float) -> Observation:
    """What happened between two scrapes that both have samples."""
    if before.samples is None or after.samples is None:
        raise ValueError("observe() needs two scrapes with samples")
    dt = after.at - before.at
    if dt <= 0:
        raise ValueError(f"scrapes must move forward in time, got dt={dt}")
    ttft = _histogram(increases(before.samples, after.samples, TTFT_BUCKETS))
    itl = _histogram(increases(before.samples, after.samples, ITL_BUCKETS))
    served = sum(s.value for s in increases(before.samples, after.samples, ROUTER_REQUESTS))
    grown = [
        *increases(before.samples, after.samples, PROMPT_TOKENS),
        *increases(before.samples, after.samples, NODE_REQUESTS),
    ]
    return Observation(
        at=after.at,
        dt=dt,
        pools={role: _pool(before, after, grown, role, dt) for role in POOLS},
        ttft_s=quantile(ttft, q),
        itl_s=quantile(itl, q),
        requests_per_s=served / dt,
    )
