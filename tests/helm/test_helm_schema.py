"""values.schema.json rejects bad values with a message that names the key."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
from helm_render import CHART, GPU_VALUES, load_values, render


@pytest.fixture(scope="module")
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


BAD_VALUES = [
    ({"prefill": {"replicas": -1}}, "/prefill/replicas", "minimum"),
    ({"decode": {"replicas": "two"}}, "/decode/replicas", "want integer"),
    ({"router": {"replica": 3}}, "/router", "'replica' not allowed"),
    ({"redis": {"url": "redis://x"}}, "/redis", "'url' not allowed"),
    ({"gpu": True}, "''", "'gpu' not allowed"),
    ({"decode": {"gpus": 1.5}}, "/decode/gpus", "want integer"),
    ({"decode": {"gpuMemoryUtilization": 0}}, "/decode/gpuMemoryUtilization", "exclusiveMinimum"),
    ({"prefill": {"gpuMemoryUtilization": 1.5}}, "/prefill/gpuMemoryUtilization", "maximum"),
    ({"prefill": {"httpPort": 70000}}, "/prefill/httpPort", "maximum"),
    ({"model": {"source": "s3"}}, "/model/source", "one of"),
    ({"model": {"source": "pvc"}}, "/model/pvc/claimName", "minLength"),
    ({"redis": {"externalUrl": "localhost:6379"}}, "/redis/externalUrl", "match pattern"),
    ({"clusterToken": {"token": "short"}}, "/clusterToken/token", "match pattern"),
    (
        {"decode": {"autoscaling": {"metrics": [{"name": "cpu", "target": "1"}]}}},
        "/decode/autoscaling/metrics/0/name",
        "one of",
    ),
    (
        {"prefill": {"resources": {"limits": {"memory": "lots"}}}},
        "/prefill/resources/limits/memory",
        "",
    ),
    (
        {"keda": {"prometheusServerAddress": "prometheus:9090"}},
        "/keda/prometheusServerAddress",
        "pattern",
    ),
]


@pytest.mark.parametrize(("values", "where", "why"), BAD_VALUES, ids=[w for _, w, _ in BAD_VALUES])
def test_schema_rejects_bad_values(
    chart: helm_python.Chart, values: dict[str, Any], where: str, why: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        chart.validate_schema(values)
    message = str(err.value)
    assert f"at '{where}'" in message or f"at {where}" in message, message
    assert why in message, message


def test_install_refuses_bad_values() -> None:
    """Rendering (what install and upgrade do) applies the schema too."""
    with pytest.raises(helm_python.HelmValuesError, match="/prefill/replicas"):
        render({"prefill": {"replicas": -1}})


def test_lint_reports_bad_values_as_errors() -> None:
    report = helm_python.lint(CHART, {"router": {"replicas": -2}})
    assert any("/router/replicas" in e for e in report["errors"]), report


@pytest.mark.parametrize(
    "values",
    [{}, load_values(GPU_VALUES), {"prefill": {"replicas": 0}, "decode": {"gpus": 8}}],
    ids=["empty", "gpu", "zero-replicas"],
)
def test_schema_accepts_good_values(chart: helm_python.Chart, values: dict[str, Any]) -> None:
    chart.validate_schema(values)
    assert helm_python.lint(CHART, values)["errors"] == []


def test_defaults_satisfy_the_schema(chart: helm_python.Chart) -> None:
    chart.validate_schema(chart.values)
    assert helm_python.lint(CHART, chart.values)["errors"] == []


def test_a_backwards_port_range_is_refused() -> None:
    with pytest.raises(helm_python.HelmError, match=r"portRange\.end"):
        render({"transfer": {"portRange": {"start": 30000, "end": 20000}}})
