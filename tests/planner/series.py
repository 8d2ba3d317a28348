"""Synthetic metric series for the planner's tests: a cluster whose counters and histograms
grow as the test says, read as `Scrape`s on an injected clock (no sleeps)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from planner.observation import (
    ITL_BUCKETS,
    NODE_REQUESTS,
    PROMPT_TOKENS,
    ROUTER_REQUESTS,
    TTFT_BUCKETS,
    NodeView,
    Sample,
    Scrape,
)

BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, float("inf"))


@dataclass
class Cluster:
    """Nodes (role and load) and cumulative counters; `scrape()` reads them at `now`."""

    now: float = 0.0
    nodes: dict[str, NodeView] = field(default_factory=dict)
    tokens: dict[str, float] = field(default_factory=dict)
    requests: dict[str, float] = field(default_factory=dict)
    ttft: dict[float, float] = field(default_factory=lambda: dict.fromkeys(BOUNDS, 0.0))
    itl: dict[float, float] = field(default_factory=lambda: dict.fromkeys(BOUNDS, 0.0))

    def add(self, node_id: str, role: str, running: int = 0, waiting: int = 0) -> None:
        self.nodes[node_id] = NodeView(node_id, role, running, waiting)
        self.tokens.setdefault(node_id, 0.0)
        self.requests.setdefault(node_id, 0.0)

    def remove(self, node_id: str) -> None:
        del self.nodes[node_id]

    def restart(self, node_id: str) -> None:
        """The node's process came back: its counters start from zero."""
        self.tokens[node_id] = 0.0
        self.requests[node_id] = 0.0

    def serve(
        self,
        node_id: str,
        tokens: float,
        requests: int,
        ttft: Iterable[float] = (),
        itl: Iterable[float] = (),
    ) -> None:
        self.tokens[node_id] += tokens
        self.requests[node_id] += requests
        for value in ttft:
            _observe(self.ttft, value)
        for value in itl:
            _observe(self.itl, value)

    def load(self, node_id: str, running: int, waiting: int = 0) -> None:
        node = self.nodes[node_id]
        self.nodes[node_id] = NodeView(node_id, node.role, running, waiting)

    def scrape(self, reachable: bool = True) -> Scrape:
        nodes = tuple(self.nodes.values())
        if not reachable:
            return Scrape(self.now, nodes, None)
        samples = []
        for node_id in self.nodes:
            labels = {"node": node_id, "role": self.nodes[node_id].role}
            samples.append(Sample(PROMPT_TOKENS, labels, self.tokens[node_id]))
            samples.append(Sample(NODE_REQUESTS, labels, self.requests[node_id]))
        for name, hist in ((TTFT_BUCKETS, self.ttft), (ITL_BUCKETS, self.itl)):
            for le, count in hist.items():
                labels = {"node": "router-0", "le": "+Inf" if le == float("inf") else str(le)}
                samples.append(Sample(name, labels, count))
        samples.append(Sample(ROUTER_REQUESTS, {"node": "router-0"}, self.ttft[float("inf")]))
        return Scrape(self.now, nodes, tuple(samples))


def _observe(hist: dict[float, float], value: float) -> None:
    for le in hist:
        if value <= le:
            hist[le] += 1
