"""OpenTelemetry traces of requests across the router and the nodes; off by default.

A process traces when it has an OTLP endpoint: its `otlp_traces_endpoint` setting (the
`--otlp-traces-endpoint` flag), else the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
OTEL_EXPORTER_OTLP_ENDPOINT variables. Spans go out over OTLP/HTTP (protobuf) from a
background thread; OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc switches to gRPC. A root span is
kept with probability `trace_sample_ratio`; a span with a parent follows its parent's choice.

OpenTelemetry is imported only when tracing is on: a process with it off gets `NO_TRACER`,
whose spans do nothing. Span times are wall-clock nanoseconds (time.time_ns()), so spans
recorded after the fact (a queue wait measured in the engine thread) line up with live ones.
W3C trace context (`traceparent`) crosses processes in HTTP headers and in the TCP KV
transfer's READ message.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("splitserve.tracing")

TRACEPARENT = "traceparent"
TRACES_PATH = "/v1/traces"
ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_ENV = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
SHUTDOWN_WAIT_S = 2.0  # at exit, how long unsent spans may hold the process
Attributes = Mapping[str, str | int | float | bool]


@dataclass(frozen=True)
class TraceConfig:
    """Where one process sends its spans. `service`: service.name (splitserve-router,
    splitserve-prefill, splitserve-decode); `instance`: the router's or node's id."""

    endpoint: str | None
    ratio: float
    service: str
    instance: str

    def __post_init__(self) -> None:
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"trace_sample_ratio must be in [0, 1], got {self.ratio}")
        if self.endpoint is not None and urlsplit(self.endpoint).scheme not in ("http", "https"):
            raise ValueError(f"otlp_traces_endpoint must be an http(s) URL, got {self.endpoint!r}")


def configured_endpoint(flag: str | None) -> str | None:
    """The traces endpoint: the setting, else the standard OTEL_* variables, else None."""
    if flag:
        return flag
    for name in ENDPOINT_ENV:
        if os.environ.get(name):
            return os.environ[name]
    return None


def traces_url(endpoint: str) -> str:
    """A bare `http://host:4318` gets OTLP/HTTP's traces path; a full URL is kept."""
    parts = urlsplit(endpoint)
    return endpoint.rstrip("/") + TRACES_PATH if parts.path in ("", "/") else endpoint


class Span:
    """A span that does nothing: what every span is while tracing is off."""

    recording = False

    def set(self, attrs: Attributes) -> None:
        """Add attributes."""

    def event(self, name: str, at_ns: int | None = None, attrs: Attributes | None = None) -> None:
        """Add a point-in-time event."""

    def end(self, at_ns: int | None = None) -> None:
        """End the span (at `at_ns`, default now); later calls do nothing."""

    def headers(self) -> dict[str, str]:
        """The W3C trace context that makes a remote span this span's child."""
        return {}


Parent = Span | Mapping[str, str] | None


class Tracer:
    """Starts spans; with no endpoint every span is the do-nothing `Span`."""

    enabled = False

    def start(
        self,
        name: str,
        parent: Parent = None,
        at_ns: int | None = None,
        attrs: Attributes | None = None,
    ) -> Span:
        """A span begun at `at_ns` (default now) under `parent`: a span of this process, or
        the headers (or TCP message) that carried a remote one's `traceparent`."""
        return _NO_SPAN

    def record(
        self, name: str, parent: Parent, start_ns: int, end_ns: int, attrs: Attributes | None = None
    ) -> Span:
        """A span that already ended (its times measured elsewhere)."""
        span = self.start(name, parent, start_ns, attrs)
        span.end(end_ns)
        return span

    def shutdown(self) -> None:
        """Send what is buffered (bounded by SHUTDOWN_WAIT_S) and stop."""


_NO_SPAN = Span()
NO_TRACER = Tracer()


def make_tracer(config: TraceConfig) -> Tracer:
    """NO_TRACER without an endpoint; else an OpenTelemetry tracer (imported only now)."""
    if config.endpoint is None:
        return NO_TRACER
    from cluster.tracing_otel import OtelTracer

    protocol = _protocol()
    url = config.endpoint if protocol == "grpc" else traces_url(config.endpoint)
    tracer = OtelTracer(config, url, protocol)
    log.info(
        "tracing_on service=%s instance=%s endpoint=%s ratio=%g",
        config.service, config.instance, config.endpoint, config.ratio,
    )  # fmt: skip
    return tracer


def _protocol() -> str:
    for name in PROTOCOL_ENV:
        value = os.environ.get(name, "").strip().lower()
        if value:
            if value not in ("http/protobuf", "grpc"):
                raise ValueError(f"{name} must be http/protobuf or grpc, got {value!r}")
            return value
    return "http/protobuf"


def now_ns() -> int:
    return time.time_ns()


def wall_ns(monotonic_s: float) -> int:
    """A time.monotonic() stamp as wall-clock ns (span times)."""
    return time.time_ns() - round((time.monotonic() - monotonic_s) * 1e9)


def trace_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace context among `headers` (empty when they carry none)."""
    return {k: headers[k] for k in (TRACEPARENT, "tracestate") if k in headers}


def shutdown_bounded(provider: Any) -> None:
    """Flush and stop an OpenTelemetry provider without holding the process longer than
    SHUTDOWN_WAIT_S when the collector is down."""
    worker = threading.Thread(target=provider.shutdown, name="otel-shutdown", daemon=True)
    worker.start()
    worker.join(SHUTDOWN_WAIT_S)
