"""The chart's Grafana dashboard: a ConfigMap for Grafana's sidecar whose every panel query
names metrics the cluster exports (router, nodes, planner), covering what an operator looks
at; the router's own dashboard page reads exported names too."""

from __future__ import annotations

import json
import re
from typing import Any

from helm_render import CHART, of_kind, render
from prometheus_client import CollectorRegistry

from node.metrics import NodeMetrics
from planner.metrics import PlannerMetrics
from router.app import create_app
from router.dashboard.data import HISTOGRAMS, NODE_COUNTERS, PAIR_SUMS, ROUTER_COUNTERS
from router.settings import RouterSettings

NAME = re.compile(r"\bsplitserve_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def _exposed(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry exposes, labelled children or not."""
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in SUFFIXES.get(family.type, ("",))
    }


def exported() -> set[str]:
    router = create_app(RouterSettings()).state.router  # its registry holds the usage ledger's
    return (
        _exposed(router.metrics.registry)
        | _exposed(NodeMetrics("prefill", "n0").registry)
        | _exposed(PlannerMetrics().registry)
    )


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
    return loaded


def _queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            exprs.append(query["query"])
    return exprs


def test_every_panel_query_names_a_metric_the_cluster_exports() -> None:
    known = exported()
    queries = _queries(_dashboard())
    assert queries
    for query in queries:
        names = NAME.findall(query)
        assert names, f"a query names no splitserve metric: {query}"
        unknown = set(names) - known
        assert not unknown, f"not exported: {sorted(unknown)} in {query}"


def test_the_panels_cover_what_operators_look_at() -> None:
    used = {n for q in _queries(_dashboard()) for n in NAME.findall(q)}
    for wanted in (
        "splitserve_router_e2e_seconds_count",  # requests/s
        "splitserve_router_completion_tokens_total",  # tokens/s
        "splitserve_router_ttft_seconds_bucket",
        "splitserve_router_itl_seconds_bucket",
        "splitserve_planner_target_seconds",
        "splitserve_running_requests",
        "splitserve_waiting_requests",
        "splitserve_kv_usage_ratio",
        "splitserve_kv_transfer_bytes_total",
        "splitserve_kv_transfer_failures_total",
        "splitserve_kv_transfer_window_seconds_bucket",  # per peer pair
        "splitserve_kv_transfer_size_bytes_sum",
        "splitserve_prefix_cache_hit_tokens_total",
        "splitserve_planner_desired_replicas",
        "splitserve_planner_decisions_total",
        "splitserve_router_key_prompt_tokens_total",
    ):
        assert wanted in used, wanted


def test_the_configmap_carries_the_dashboard_for_the_sidecar() -> None:
    values = {"grafana": {"dashboard": {"enabled": True, "namespace": "monitoring"}}}
    (config_map,) = of_kind(render(values), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert json.loads(config_map["data"]["splitserve.json"]) == _dashboard()


def test_the_router_dashboard_page_reads_exported_names() -> None:
    known = exported()
    names = {*ROUTER_COUNTERS.values(), *NODE_COUNTERS.values(), *PAIR_SUMS.values()}
    names |= {h + "_bucket" for h in HISTOGRAMS.values()}
    assert names <= known, sorted(names - known)
