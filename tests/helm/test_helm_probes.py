"""Probes and the ServiceMonitor hit paths the servers really serve.

The paths come from the FastAPI apps themselves: `route_paths()` in router.app,
prefill_node.app and decode_node.app.
"""

from __future__ import annotations

import importlib

import pytest
from helm_render import container_port, deployments, main_container, render

APPS = {"router": "router.app", "prefill": "prefill_node.app", "decode": "decode_node.app"}
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def _served_paths(component: str) -> set[str]:
    module = importlib.import_module(APPS[component])
    paths: set[str] = module.route_paths()
    return paths


@pytest.mark.parametrize("component", list(APPS))
def test_probe_paths_are_served(component: str) -> None:
    served = _served_paths(component)
    container = main_container(deployments(render())[component])
    for probe in PROBES:
        path = container[probe]["httpGet"]["path"]
        assert path in served, f"{component} {probe} hits {path}, served: {sorted(served)}"
    assert "/metrics" in served  # what the ServiceMonitor scrapes


@pytest.mark.parametrize("component", list(APPS))
def test_probes_target_the_http_port(component: str) -> None:
    container = main_container(deployments(render())[component])
    port = container_port(container, "http")
    for probe in PROBES:
        target = container[probe]["httpGet"]["port"]
        assert target == "http" or target == port, f"{probe} targets {target}"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
