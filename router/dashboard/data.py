"""What the dashboard page polls: one JSON snapshot of the cluster.

Cumulative numbers only (counters and histogram buckets): the page turns two snapshots into
rates and percentiles over its own window. Sources: the router's own metrics, the
membership (each node's load from its heartbeat), each node's /metrics (KV transfers, also
per peer it read from; prefix cache; a node that does not answer within a second is shown
without them) and the planner's last decision in Redis (absent without a planner).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from cluster.node_records import NodeRecord
from cluster.planner_status import PlannerStatus, status_key
from cluster.registry import REDIS_ERRORS, Membership
from router.state import RouterState

NODE_TIMEOUT_S = 1.0
ROUTER_COUNTERS = {
    "requests": "splitserve_router_e2e_seconds_count",
    "prompt_tokens": "splitserve_router_prompt_tokens_total",
    "completion_tokens": "splitserve_router_completion_tokens_total",
    "errors": "splitserve_router_node_errors_total",
}
ROUTE_REQUESTS = "splitserve_router_requests_total"
HISTOGRAMS = {"ttft": "splitserve_router_ttft_seconds", "itl": "splitserve_router_itl_seconds"}
NODE_COUNTERS = {
    "transfer_bytes": "splitserve_kv_transfer_bytes_total",
    "transfers": "splitserve_kv_transfer_seconds_count",
    "transfer_failures": "splitserve_kv_transfer_failures_total",
    "prefix_hit_tokens": "splitserve_prefix_cache_hit_tokens_total",
    "prefix_query_tokens": "splitserve_prefix_cache_query_tokens_total",
    "generated_tokens": "splitserve_generation_tokens_total",
}
# per (transport, peer): completed READs, their windows and bytes
PAIR_SUMS = {
    "reads": "splitserve_kv_transfer_window_seconds_count",
    "window_s": "splitserve_kv_transfer_window_seconds_sum",
    "bytes": "splitserve_kv_transfer_size_bytes_sum",
}


async def snapshot(state: RouterState) -> dict[str, Any]:
    records = state.membership.all_nodes()
    node_metrics, planner = await asyncio.gather(
        asyncio.gather(*(_node_counters(state, r) for r in records)),
        _planner(state),
    )
    samples = [s for f in state.metrics.registry.collect() for s in f.samples]
    return {
        "at": time.time(),
        "model": state.settings.model_name(),
        "router": {key: _sum(samples, name) for key, name in ROUTER_COUNTERS.items()},
        "routes": _routes(samples),
        "histograms": {key: _buckets(samples, name) for key, name in HISTOGRAMS.items()},
        "nodes": [_node(r, m) for r, m in zip(records, node_metrics, strict=True)],
        "planner": planner.model_dump() if planner else None,
    }


def _routes(samples: Iterable[Any]) -> dict[str, dict[str, float]]:
    """Requests answered and errors (4xx, 5xx) per route, the dashboard's own left out."""
    routes: dict[str, dict[str, float]] = {}
    for s in samples:
        route = s.labels.get("route", "")
        if s.name != ROUTE_REQUESTS or route.startswith("/dashboard"):
            continue
        counts = routes.setdefault(route, {"requests": 0.0, "errors": 0.0})
        counts["requests"] += s.value
        counts["errors"] += s.value if s.labels.get("status", "")[:1] in ("4", "5") else 0.0
    return routes


def _sum(samples: Iterable[Any], name: str) -> float:
    return float(sum(s.value for s in samples if s.name == name))


def _buckets(samples: Iterable[Any], name: str) -> list[list[float]]:
    """[[upper bound, cumulative count], ...] ascending; +Inf as 1e308 (JSON has no inf)."""
    out: dict[float, float] = {}
    for s in samples:
        if s.name == name + "_bucket":
            le = float(s.labels["le"])
            out[le] = out.get(le, 0.0) + s.value
    return [[min(le, 1e308), count] for le, count in sorted(out.items())]


def transfer_pairs(samples: Iterable[Any]) -> list[dict[str, Any]]:
    """A reading node's completed READs per (transport, peer it read from): their count,
    summed windows and bytes (cumulative), sorted by peer."""
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    names = {name: key for key, name in PAIR_SUMS.items()}
    for s in samples:
        key = names.get(s.name)
        if key is None:
            continue
        pair = (s.labels["transport"], s.labels["peer"])
        row = pairs.setdefault(
            pair, {"transport": pair[0], "peer": pair[1]} | dict.fromkeys(PAIR_SUMS, 0.0)
        )
        row[key] += s.value
    return [pairs[k] for k in sorted(pairs, key=lambda k: (k[1], k[0]))]


def _node(record: NodeRecord, counters: dict[str, Any] | None) -> dict[str, Any]:
    info, load = record.info, record.load
    return {
        "id": info.node_id,
        "role": info.role,
        "url": info.url,
        "running": load.running,
        "waiting": load.waiting,
        "kv_usage": load.kv_usage,
        "leases": load.leases_held,
        "counters": counters,
    }


async def _node_counters(state: RouterState, record: NodeRecord) -> dict[str, Any] | None:
    if state.nodes is None:
        return None
    try:
        text = await state.nodes.metrics_text(record.info, NODE_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    counters: dict[str, Any] = {key: _sum(samples, name) for key, name in NODE_COUNTERS.items()}
    counters["pairs"] = transfer_pairs(samples)
    return counters


async def _planner(state: RouterState) -> PlannerStatus | None:
    members = state.membership
    if not isinstance(members, Membership) or members.redis is None:
        return None
    with contextlib.suppress(*REDIS_ERRORS, ValidationError):
        raw = await members.redis.get(status_key(members.namespace))
        if raw is not None:
            return PlannerStatus.model_validate_json(raw)
    return None
