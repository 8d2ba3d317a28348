"""Prometheus metrics of the router, in a registry of its own (one per app)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class RouterMetrics:
    """The router's counters and histograms. Label values are short fixed words."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "splitserve_router_requests",
            "HTTP requests answered, by route and status code",
            ["route", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "splitserve_router_ttft_seconds",
            "Time from request arrival to the first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.request_latency = Histogram(
            "splitserve_router_request_seconds",
            "Time from request arrival to the end of generation",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.local_prefill = Counter(
            "splitserve_router_local_prefill",
            "Requests prefilled on the decode node instead of the prefill pool, by reason",
            ["reason"],
            registry=r,
        )
        self.prefill_retries = Counter(
            "splitserve_router_prefill_retries", "Prefill calls retried on another node", registry=r
        )
        self.decode_resumes = Counter(
            "splitserve_router_decode_resumes",
            "Decodes resumed on another node after a failure",
            registry=r,
        )
        self.node_errors = Counter(
            "splitserve_router_node_errors",
            "Failed calls to nodes, by node role and failure kind",
            ["role", "kind"],
            registry=r,
        )
        self.inflight = Gauge(
            "splitserve_router_inflight_requests", "Requests being served", registry=r
        )
        self.prompt_tokens = Counter(
            "splitserve_router_prompt_tokens", "Prompt tokens of served requests", registry=r
        )
        self.completion_tokens = Counter(
            "splitserve_router_completion_tokens", "Tokens generated for clients", registry=r
        )

    def render(self) -> tuple[bytes, str]:
        """(body, content type) for GET /metrics."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
