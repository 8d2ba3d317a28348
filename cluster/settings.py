"""What the settings of every process share: the settings every server process declares
(address, Redis, log level) and those of the processes that serve a model (the router and
the nodes), and the cluster token's rule. Each component declares
its own settings (config_kit): router.settings, node.settings, planner.settings."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from cluster.tracing import TraceConfig, configured_endpoint
from config_kit import Helm, Secret, SettingsError, Up, check_fields, setting
from models import ModelSource

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
LOG_LEVELS = ("debug", "info", "warning", "error")
# cluster_token's variable, where `up` hands each run's own token to its children
CLUSTER_TOKEN_ENV = "SPLITSERVE_CLUSTER_TOKEN"
__all__ = [
    "CLUSTER_TOKEN_ENV",
    "DEFAULT_REDIS_URL",
    "ModelProcessSettings",
    "ProcessSettings",
    "SettingsError",
]


@dataclass(frozen=True)
class ProcessSettings:
    """Every server process: where it listens and where the cluster's registry is."""

    host: str = setting("127.0.0.1", "address to listen on", up=Up.OWN, helm=Helm.CHART)
    redis_url: str = setting(
        DEFAULT_REDIS_URL, "Redis holding the cluster registry", up=Up.OWN, helm=Helm.CHART
    )
    log_level: str = setting("info", "log level", choices=LOG_LEVELS)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class ModelProcessSettings(ModelSource, ProcessSettings):
    """The router and the nodes: the model they serve, the token between them, the drain."""

    # Needed on every /internal/* call and on the KV transfer handshake when set.
    cluster_token: Secret | None = setting(
        None, "the token /internal/* calls and KV handshakes carry (at least 16 characters; "
        "prefer the variable)", up=Up.OWN, helm=Helm.CHART,
    )  # fmt: skip
    drain_timeout_s: float = setting(
        30.0, "after SIGTERM: seconds running requests get to finish", gt=0, helm=Helm.CHART
    )
    # OpenTelemetry traces (cluster.tracing), the router's and every node's alike
    otlp_traces_endpoint: str | None = setting(
        None, "send traces over OTLP to this collector URL (Jaeger, Tempo): http://host:4318 "
        "or the full traces URL; default: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, else no "
        "tracing", helm=Helm.CHART,
    )  # fmt: skip
    trace_sample_ratio: float = setting(
        1.0, "share of requests traced (a client's traceparent decides for its own requests)",
        ge=0, le=1, helm=Helm.CHART,
    )  # fmt: skip

    def __post_init__(self) -> None:
        check_fields(self)
        check_token(self.cluster_token)
        url = self.otlp_traces_endpoint
        if url is not None and urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(
                "otlp_traces_endpoint must be an http(s) URL such as http://localhost:4318, "
                f"got {url!r}"
            )

    def trace_config(self, service: str, instance: str) -> TraceConfig:
        """Where and how often this process exports its spans, named splitserve-<service>."""
        endpoint = configured_endpoint(self.otlp_traces_endpoint)
        return TraceConfig(endpoint, self.trace_sample_ratio, f"splitserve-{service}", instance)


def check_token(token: Secret | None) -> None:
    if token is not None and len(token.get_secret_value()) < 16:
        raise ValueError("cluster_token must be at least 16 characters")
