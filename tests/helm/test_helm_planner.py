"""planner.enabled: one planner pod whose command line parses with `splitserve planner`,
reading Prometheus (or the router directly) with each pool's min / max, scraped like the
other components; each pool's autoscaler then follows splitserve_planner_desired_replicas."""

from __future__ import annotations

import argparse

import pytest
from helm_render import (
    NAMESPACE,
    POOLS,
    container_port,
    deployments,
    env_of,
    main_container,
    of_kind,
    one,
    render,
    selected_components,
)

from planner.cli import add_arguments

PLANNER = {
    "planner": {"enabled": True, "ttftSloMs": 500},
    "prefill": {"autoscaling": {"minReplicas": 2, "maxReplicas": 6}},
}


def _args(values: dict) -> argparse.Namespace:
    container = main_container(deployments(render(values))["planner"])
    command, *argv = (str(a) for a in container["args"])
    assert command == "planner"
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_planner_command_line_parses_with_the_pools_limits() -> None:
    args = _args(PLANNER)
    assert args.prometheus_url == "http://prometheus-operated.monitoring.svc:9090"
    assert args.router_url is None and args.ttft_slo_ms == 500
    assert (args.min_prefill, args.max_prefill, args.min_decode, args.max_decode) == (2, 6, 1, 4)
    direct = _args(PLANNER | {"planner": {"enabled": True, "source": "direct"}})
    assert direct.prometheus_url is None and direct.router_url == [
        "http://ss-splitserve-router:8000"
    ]


def test_the_planner_pod_reads_redis_and_is_scraped() -> None:
    docs = render(PLANNER | {"metrics": {"serviceMonitor": {"enabled": True}}})
    planner = main_container(deployments(docs)["planner"])
    assert "SPLITSERVE_REDIS_URL" in env_of(planner)
    assert int(_args(PLANNER).port) == container_port(planner, "http")
    service = one(docs, "Service", "planner")
    assert service["metadata"]["labels"]["splitserve.io/metrics"] == "true"
    wanted = of_kind(docs, "ServiceMonitor")[0]["spec"]["selector"]["matchLabels"].items()
    assert wanted <= service["metadata"]["labels"].items()  # the ServiceMonitor scrapes it


@pytest.mark.parametrize("keda", [True, False])
def test_each_pool_scales_on_the_planners_decision(keda: bool) -> None:
    docs = render(PLANNER | {"keda": {"enabled": keda}})
    for pool in POOLS:
        assert "replicas" not in deployments(docs)[pool]["spec"], pool
        if keda:
            scaled = one(docs, "ScaledObject", pool)
            (trigger,) = scaled["spec"]["triggers"]
            assert trigger["metricType"] == "AverageValue"
            assert trigger["metadata"]["threshold"] == "1"
            query = trigger["metadata"]["query"]
            assert query == (
                f'max(splitserve_planner_desired_replicas{{pool="{pool}",namespace="{NAMESPACE}"}})'
            )
        else:
            (metric,) = one(docs, "HorizontalPodAutoscaler", pool)["spec"]["metrics"]
            assert metric["external"]["metric"]["name"] == "splitserve_planner_desired_replicas"
            assert metric["external"]["metric"]["selector"]["matchLabels"] == {"pool": pool}
            assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    assert {str(d["spec"].get("minReplicaCount", d["spec"].get("minReplicas"))) for d in docs
            if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")} == {"1", "2"}  # fmt: skip


def test_the_planner_may_reach_the_bundled_redis() -> None:
    docs = render(PLANNER)
    policies = [
        p for p in of_kind(docs, "NetworkPolicy")
        if selected_components(docs, p["spec"]["podSelector"]) == {"redis"}
    ]  # fmt: skip
    (policy,) = policies
    allowed = selected_components(docs, policy["spec"]["ingress"][0]["from"][0]["podSelector"])
    assert "planner" in allowed


def test_without_the_planner_nothing_of_it_renders() -> None:
    docs = render()
    assert "planner" not in deployments(docs)
    assert not of_kind(docs, "ConfigMap")
