"""The chart lints, renders and every manifest validates against the Kubernetes schema."""

from __future__ import annotations

from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
from custom_resources import SCHEMAS, validate_custom
from helm_render import CHART, GPU_VALUES, load_values, of_kind, render, render_files

KUBE_VERSION = "1.30"
ERROR = 3


# The toggles neither the defaults nor the GPU file turn on.
OTHER_TOGGLES: dict[str, Any] = {
    "auth": {"existingSecret": "llm-key"},
    "model": {"source": "pvc", "pvc": {"claimName": "models", "readOnly": False}},
    "redis": {"externalUrlSecret": {"name": "redis-cred", "key": "url"}},
    "router": {
        "service": {"type": "LoadBalancer"},
        "autoscaling": {"enabled": True},
        "pdb": {"minAvailable": "50%"},
    },
    "prefill": {"autoscaling": {"enabled": True}, "updateStrategy": {"type": "Recreate"}},
    "decode": {"autoscaling": {"enabled": True, "behavior": {"scaleDown": {"policies": []}}}},
    "transfer": {"portRange": {"enabled": False}},
    "networkPolicy": {"nodeToNodeHttp": True, "routerFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]},
}
# The planner and the Grafana dashboard, with each pool's autoscaler from KEDA or an HPA.
PLANNER: dict[str, Any] = {
    "planner": {"enabled": True},
    "grafana": {"dashboard": {"enabled": True}},
}
CASES = ["default", "gpu", "other", "planner-keda", "planner-hpa"]


def _values(case: str) -> dict[str, Any]:
    return {
        "default": {},
        "gpu": load_values(GPU_VALUES),
        "other": OTHER_TOGGLES,
        "planner-keda": PLANNER | {"keda": {"enabled": True}},
        "planner-hpa": PLANNER | {"planner": {"enabled": True, "source": "direct"}},
    }[case]


@pytest.mark.parametrize("case", CASES)
def test_lint_passes(case: str) -> None:
    report = helm_python.lint(CHART, _values(case), strict=True, kube_version=f"v{KUBE_VERSION}.0")
    errors = [m for m in report["messages"] if m["severity"] >= ERROR]
    assert report["errors"] == [] and errors == [], report


@pytest.mark.parametrize("case", CASES)
def test_every_manifest_validates(case: str) -> None:
    docs = render(_values(case))
    assert docs
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in SCHEMAS:
            validate_custom(doc)
        else:
            try:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                pytest.fail(f"{where}: a kind with no schema to validate against")
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where}: {exc.message}")


def test_default_render_is_a_plain_cpu_install() -> None:
    kinds = sorted({d["kind"] for d in render()})
    assert kinds == [
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "ServiceAccount",
    ]


def test_gpu_values_render_the_custom_resources() -> None:
    docs = render(load_values(GPU_VALUES))
    assert len(of_kind(docs, "ScaledObject")) == 2
    assert len(of_kind(docs, "ServiceMonitor")) == 1
    assert len(of_kind(docs, "Ingress")) == 1
    assert of_kind(docs, "HorizontalPodAutoscaler") == []  # KEDA owns the pools' HPAs


def test_custom_resource_schemas_catch_mistakes() -> None:
    docs = render(load_values(GPU_VALUES))
    scaled = of_kind(docs, "ScaledObject")[0]
    del scaled["spec"]["triggers"][0]["metadata"]["query"]
    with pytest.raises(jsonschema.ValidationError, match="query"):
        validate_custom(scaled)
    monitor = of_kind(docs, "ServiceMonitor")[0]
    monitor["spec"]["endpoints"][0]["interval"] = "fifteen seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(monitor)


def test_notes_tell_how_to_reach_the_api() -> None:
    notes = render_files({"auth": {"apiKey": "sk-test"}})["splitserve/templates/NOTES.txt"]
    assert "port-forward svc/ss-splitserve-router 8000:8000" in notes
    assert "get secret ss-splitserve-api-key" in notes
    assert "/v1/chat/completions" in notes
    ingress = {"router": {"ingress": {"enabled": True}}}
    assert "http://splitserve.local" in render_files(ingress)["splitserve/templates/NOTES.txt"]
