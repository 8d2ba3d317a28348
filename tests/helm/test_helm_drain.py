"""Shutdown: every splitserve process gets a drain timeout that ends before the kubelet's
SIGKILL (terminationGracePeriodSeconds), after the router's preStop pause."""

from __future__ import annotations

import pytest
from helm_render import deployments, env_of, main_container, pod_spec, render


@pytest.mark.parametrize("grace", [None, 45])
def test_the_drain_ends_before_the_grace_period(grace: int | None) -> None:
    values = (
        {}
        if grace is None
        else {p: {"terminationGracePeriodSeconds": grace} for p in ("router", "prefill", "decode")}
    )
    docs = deployments(render(values))
    for component in ("router", "prefill", "decode"):
        spec = pod_spec(docs[component])
        container = main_container(docs[component])
        drain = float(env_of(container)["SPLITSERVE_DRAIN_TIMEOUT_S"]["value"])
        pause = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        assert 0 < pause + drain <= spec["terminationGracePeriodSeconds"] - 5, component
        if grace is not None:
            assert spec["terminationGracePeriodSeconds"] == grace
    router = main_container(docs["router"])
    assert router["lifecycle"]["preStop"]["sleep"]["seconds"] == 5  # the Service lets go first
