"""Prometheus metrics of the router, in a registry of its own (one per app).

Every series carries `role="router"` and `node=<router id>` (hostname:port), like the nodes'
series carry their role and node id. Latencies are as the client sees them.
"""

from __future__ import annotations

import socket
from typing import Generic, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from router.settings import RouterSettings

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
_BASE = ("role", "node")
M = TypeVar("M", Counter, Gauge, Histogram)


def router_id(settings: RouterSettings) -> str:
    """The router's `node` label: hostname:port."""
    return f"{socket.gethostname()}:{settings.port}"


class Family(Generic[M]):
    """A labelled metric whose `role` and `node` labels are already bound."""

    def __init__(self, metric: M, base: tuple[str, str]) -> None:
        self._metric: M = metric
        self._base = base

    def labels(self, *values: str) -> M:
        return self._metric.labels(*self._base, *values)


class RouterMetrics:
    """The router's counters and histograms. Label values are short fixed words."""

    def __init__(self, node_id: str = "router") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, base = self.registry, ("router", node_id)
        self.base = base
        self.requests = Family(
            Counter(
                "splitserve_router_requests",
                "HTTP requests answered, by route and status code",
                [*_BASE, "route", "status"],
                registry=r,
            ),
            base,
        )
        self.ttft = Histogram(
            "splitserve_router_ttft_seconds",
            "Time from request arrival to the first generated token",
            _BASE,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ).labels(*base)
        self.itl = Histogram(
            "splitserve_router_itl_seconds",
            "Time between consecutive tokens of a request (0 for tokens that came together)",
            _BASE,
            buckets=_ITL_BUCKETS,
            registry=r,
        ).labels(*base)
        self.request_latency = Histogram(
            "splitserve_router_e2e_seconds",
            "Time from request arrival to the end of generation",
            _BASE,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ).labels(*base)
        self.local_prefill = Family(
            Counter(
                "splitserve_router_local_prefill",
                "Requests prefilled on the decode node instead of the prefill pool, by reason",
                [*_BASE, "reason"],
                registry=r,
            ),
            base,
        )
        self.prefill_retries = Counter(
            "splitserve_router_prefill_retries",
            "Prefill calls retried on another node",
            _BASE,
            registry=r,
        ).labels(*base)
        self.constrained_requests = Counter(
            "splitserve_router_constrained_requests",
            "Requests sent with a grammar: response_format json, or a forced tool call",
            _BASE,
            registry=r,
        ).labels(*base)
        self.ignored_fields = Family(
            Counter(
                "splitserve_router_ignored_fields",
                "Request fields ignored as unknown (names in the log), by route",
                [*_BASE, "route"],
                registry=r,
            ),
            base,
        )
        self.decode_resumes = Counter(
            "splitserve_router_decode_resumes",
            "Decodes resumed on another node after a failure",
            _BASE,
            registry=r,
        ).labels(*base)
        self.node_errors = Family(
            Counter(
                "splitserve_router_node_errors",
                "Failed calls to nodes, by node role and failure kind",
                [*_BASE, "node_role", "kind"],
                registry=r,
            ),
            base,
        )
        self.inflight = Gauge(
            "splitserve_router_inflight_requests", "Requests being served", _BASE, registry=r
        ).labels(*base)
        self.queued = Gauge(
            "splitserve_router_queued_requests",
            "Requests waiting in the router's queue for a slot",
            _BASE,
            registry=r,
        ).labels(*base)
        self.admission_limit = Gauge(
            "splitserve_router_admission_limit",
            "Requests served at once at most: max_inflight, or what the pools hold if fewer",
            _BASE,
            registry=r,
        ).labels(*base)
        self.decode_waits = Counter(
            "splitserve_router_decode_waits",
            "Pauses of prefilled requests while every decode node was busy",
            _BASE,
            registry=r,
        ).labels(*base)
        self.queue_time = Family(
            Histogram(
                "splitserve_router_queue_seconds",
                "Time requests waited in the router's queue, by priority (clamped to -9..9)",
                [*_BASE, "priority"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            ),
            base,
        )
        self.prompt_tokens = Counter(
            "splitserve_router_prompt_tokens", "Prompt tokens of served requests", _BASE, registry=r
        ).labels(*base)
        self.completion_tokens = Counter(
            "splitserve_router_completion_tokens",
            "Tokens generated for clients",
            _BASE,
            registry=r,
        ).labels(*base)

        self.kv = KVMetrics(r, base)

    def observe_queue(self, priority: int, seconds: float) -> None:
        """One admitted request's wait; the label keeps priorities to 19 values."""
        self.queue_time.labels(str(max(-9, min(9, priority)))).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        """(body, content type) for GET /metrics."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class KVMetrics:
    """The prefix index and the kv_aware policy: prefix-hit tokens the index predicted for
    the chosen node against those the node reported, by pool, node and policy; the index's
    size by pool; the delay of KV events from node to router."""

    def __init__(self, r: CollectorRegistry, base: tuple[str, str]) -> None:
        labels = [*_BASE, "pool", "target", "policy"]
        self.predicted_hit_tokens = Family(
            Counter(
                "splitserve_router_kv_predicted_hit_tokens",
                "Prompt tokens the prefix index expected the chosen node to hold",
                labels,
                registry=r,
            ),
            base,
        )
        self.actual_hit_tokens = Family(
            Counter(
                "splitserve_router_kv_actual_hit_tokens",
                "Prompt tokens the chosen node took from its prefix cache",
                labels,
                registry=r,
            ),
            base,
        )
        self.routed = Family(
            Counter(
                "splitserve_router_kv_routed_requests",
                "Requests routed, by whether the chosen node held the longest cached prefix "
                "of the candidates as the index saw it (match: longest, shorter, or none: no "
                "candidate held any)",
                [*_BASE, "pool", "policy", "match"],
                registry=r,
            ),
            base,
        )
        self.index_blocks = Family(
            Gauge(
                "splitserve_router_kv_index_blocks",
                "Blocks in the prefix index, counted per node, by pool",
                [*_BASE, "pool"],
                registry=r,
            ),
            base,
        )
        self.event_lag = Histogram(
            "splitserve_router_kv_event_lag_seconds",
            "Time from a node publishing a KV event to the router applying it",
            _BASE,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        ).labels(*base)
