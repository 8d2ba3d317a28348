"""The planner's decision and inputs as Prometheus series: desired replicas by pool (what
KEDA / HPA scale on), and a counted reason for every change."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from cluster.planner_status import PlannerStatus, PoolStatus
from planner.metrics import PlannerMetrics


def _values(metrics: PlannerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, _ = metrics.render()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_desired_replicas_and_reasons_are_published() -> None:
    m = PlannerMetrics()
    up = PoolStatus(current=1, desired=2, load=900.0, capacity=400.0, reason="load", direction="up")
    status = PlannerStatus(
        at=1.0, interval_s=5.0, source_ok=True, ttft_target_s=1.0, itl_target_s=0.1,
        ttft_s=2.5, pools={"prefill": up, "decode": PoolStatus(current=1, desired=1)},
    )  # fmt: skip
    m.publish(status)
    m.publish(status.model_copy(update={"source_ok": False}))
    v = _values(m)
    assert v[("splitserve_planner_desired_replicas", (("pool", "prefill"),))] == 2
    assert v[("splitserve_planner_desired_replicas", (("pool", "decode"),))] == 1
    assert v[("splitserve_planner_capacity_per_node", (("pool", "prefill"),))] == 400
    key = (("direction", "up"), ("pool", "prefill"), ("reason", "load"))
    assert v[("splitserve_planner_decisions_total", key)] == 2
    assert v[("splitserve_planner_latency_seconds", (("kind", "ttft"),))] == 2.5
    assert v[("splitserve_planner_source_up", ())] == 0
