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
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

from cluster.trace_api import (
    NO_TRACER,
    Attributes,
    Parent,
    Span,
    TraceConfig,
    Tracer,
)

__all__ = ["NO_TRACER", "Attributes", "Parent", "Span", "TraceConfig", "Tracer"]
log = logging.getLogger("splitserve.tracing")

TRACEPARENT = "traceparent"
TRACES_PATH = "/v1/traces"
ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_ENV = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


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
