"""Prometheus metrics of a prefill, decode or colocated node (GET /metrics).

Each app has its own registry, so several nodes can live in one process (tests). Gauges are
set from the node's load when scraped; every series carries the labels `role` and `node`.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from cluster.protocol import NodeLoad

_LABELS = ("role", "node")


class NodeMetrics:
    """The node's gauges, labelled with its role and id."""

    def __init__(self, role: str, node_id: str) -> None:
        self.registry = CollectorRegistry()
        self._labels = (role, node_id)
        self.running = self._gauge("splitserve_running_requests", "Requests being computed")
        self.waiting = self._gauge("splitserve_waiting_requests", "Requests queued for a slot")
        self.kv_usage = self._gauge(
            "splitserve_kv_usage_ratio", "Share of KV blocks held by requests (0..1)"
        )
        self.leases = self._gauge("splitserve_kv_leases", "KV leases held for decode nodes")

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, _LABELS, registry=self.registry)

    def observe(self, load: NodeLoad) -> None:
        labels = self._labels
        self.running.labels(*labels).set(load.running)
        self.waiting.labels(*labels).set(load.waiting)
        self.kv_usage.labels(*labels).set(load.kv_usage)
        self.leases.labels(*labels).set(load.leases_held)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
