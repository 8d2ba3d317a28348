"""Render the chart offline and look things up in the manifests (shared by tests/helm)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "splitserve"
GPU_VALUES = CHART / "ci" / "gpu-values.yaml"
RELEASE = "ss"
NAMESPACE = "llm"
POOLS = ("prefill", "decode")
COMPONENT_LABEL = "app.kubernetes.io/component"

Manifest = dict[str, Any]
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_values(path: Path) -> dict[str, Any]:
    """A values file as Helm parses `-f FILE`."""
    return helm_python.values_from_yaml(path.read_text())


def render_files(values: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Template path -> rendered text, for a release RELEASE in NAMESPACE."""
    with helm_python.Chart.load(CHART) as chart:
        return chart.render(dict(values or {}), name=RELEASE, namespace=NAMESPACE)


def render(values: Mapping[str, Any] | None = None) -> list[Manifest]:
    """Every Kubernetes object the chart renders (NOTES.txt excluded)."""
    docs: list[Manifest] = []
    for path, text in render_files(values).items():
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.load_all(text, Loader=_Loader) if d)
    return docs


def of_kind(docs: list[Manifest], kind: str) -> list[Manifest]:
    return [d for d in docs if d["kind"] == kind]


def component_of(doc: Manifest) -> str | None:
    return doc["metadata"].get("labels", {}).get(COMPONENT_LABEL)


def one(docs: list[Manifest], kind: str, component: str) -> Manifest:
    """The single object of `kind` that belongs to `component`."""
    found = [d for d in of_kind(docs, kind) if component_of(d) == component]
    assert len(found) == 1, f"expected one {kind} for {component}, got {len(found)}"
    return found[0]


def deployments(docs: list[Manifest]) -> dict[str, Manifest]:
    """component -> Deployment."""
    return {str(component_of(d)): d for d in of_kind(docs, "Deployment")}


def pod_spec(deployment: Manifest) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def pod_labels(deployment: Manifest) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def main_container(deployment: Manifest) -> dict[str, Any]:
    containers = pod_spec(deployment)["containers"]
    assert len(containers) == 1
    return containers[0]


def all_containers(deployment: Manifest) -> Iterator[dict[str, Any]]:
    spec = pod_spec(deployment)
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def env_of(container: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Env var name -> its EnvVar object."""
    return {e["name"]: e for e in container.get("env", [])}


def arg_after(container: Mapping[str, Any], flag: str) -> str:
    args = [str(a) for a in container["args"]]
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def container_port(container: Mapping[str, Any], name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    return int(ports[name])


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes LabelSelector semantics (matchLabels + matchExpressions)."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]
        if not ok:
            return False
    return True


def selected_components(docs: list[Manifest], selector: Mapping[str, Any]) -> set[str]:
    """Components whose pods a selector picks among this release's Deployments."""
    return {c for c, d in deployments(docs).items() if selector_matches(selector, pod_labels(d))}
