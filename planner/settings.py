"""`splitserve planner`'s settings: the process's own and the planner's (planner.config), one
set of flags and SPLITSERVE_* variables generated from their declarations (config_kit)."""

from __future__ import annotations

from dataclasses import dataclass

from cluster.settings import ProcessSettings
from config_kit import Given, Helm, Up, part, setting
from planner.config import PlannerConfig


@dataclass(frozen=True)
class PlannerSettings(ProcessSettings):
    """The planner process: where it serves its decision and where it reads the metrics."""

    port: int = setting(
        9400, "serves /metrics and /status", ge=1, le=65535, up=Up.OWN, helm=Helm.CHART
    )
    router_url: list[str] = setting(
        help="a router whose /metrics to read (repeat for several); nodes come from the registry",
        factory=list, metavar="URL", up=Up.OWN, helm=Helm.CHART,
    )  # fmt: skip
    prometheus_url: str | None = setting(
        None, "read the metrics from Prometheus", up=Up.OWN, helm=Helm.CHART
    )
    config: Given[PlannerConfig] = part(PlannerConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if bool(self.router_url) == bool(self.prometheus_url):
            raise ValueError("give --router-url or --prometheus-url (one)")
