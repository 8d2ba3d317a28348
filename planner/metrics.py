"""The planner's decision and its inputs as Prometheus metrics (GET /metrics of
`splitserve planner`). KEDA / HPA scale each pool on
`splitserve_planner_desired_replicas{pool}`."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from cluster.planner_status import PlannerStatus

DESIRED = "splitserve_planner_desired_replicas"


class PlannerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        pool = ["pool"]
        self.desired = Gauge(DESIRED, "Replicas the planner wants, by pool", pool, registry=r)
        self.current = Gauge(
            "splitserve_planner_current_replicas",
            "Nodes of the pool in the registry (whoever started them)",
            pool,
            registry=r,
        )
        self.starting = Gauge(
            "splitserve_planner_starting_replicas",
            "Nodes a scale-up asked for that are not in the registry yet (still loading)",
            pool,
            registry=r,
        )
        self.floor = Gauge(
            "splitserve_planner_floor_replicas",
            "Nodes the pool's running requests need (never scaled below)",
            pool,
            registry=r,
        )
        self.load = Gauge(
            "splitserve_planner_load",
            "Load seen over the last interval: prompt tokens/s (prefill), sequences (decode)",
            pool,
            registry=r,
        )
        self.predicted = Gauge(
            "splitserve_planner_predicted_load",
            "Load predicted a few intervals ahead, in the same unit",
            pool,
            registry=r,
        )
        self.capacity = Gauge(
            "splitserve_planner_capacity_per_node",
            "Learned capacity of one node at the target, in the load's unit (0: not yet)",
            pool,
            registry=r,
        )
        self.decisions = Counter(
            "splitserve_planner_decisions",
            "Changes of the desired replicas, by pool, direction and reason",
            ["pool", "direction", "reason"],
            registry=r,
        )
        self.latency = Gauge(
            "splitserve_planner_latency_seconds",
            "The latency quantile the planner saw over the last interval, by kind (ttft, itl)",
            ["kind"],
            registry=r,
        )
        self.target = Gauge(
            "splitserve_planner_target_seconds",
            "The latency targets, by kind (ttft, itl)",
            ["kind"],
            registry=r,
        )
        self.source_up = Gauge(
            "splitserve_planner_source_up",
            "1 when the last metrics read succeeded, else 0 (the decision is held)",
            registry=r,
        )

    def publish(self, status: PlannerStatus) -> None:
        for name, pool in status.pools.items():
            self.desired.labels(name).set(pool.desired)
            self.current.labels(name).set(pool.current)
            self.starting.labels(name).set(pool.starting)
            self.floor.labels(name).set(pool.floor)
            self.load.labels(name).set(pool.load)
            self.predicted.labels(name).set(pool.predicted)
            self.capacity.labels(name).set(pool.capacity or 0.0)
            if pool.direction is not None:
                self.decisions.labels(name, pool.direction, pool.reason).inc()
        self.target.labels("ttft").set(status.ttft_target_s)
        self.target.labels("itl").set(status.itl_target_s)
        for kind, value in (("ttft", status.ttft_s), ("itl", status.itl_s)):
            if value is not None:
                self.latency.labels(kind).set(value)
        self.source_up.set(1 if status.source_ok else 0)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
