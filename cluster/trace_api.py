"""The tracing interface every process holds, OpenTelemetry or not (cluster.tracing)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

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


def shutdown_bounded(provider: Any) -> None:
    """Flush and stop an OpenTelemetry provider without holding the process longer than
    SHUTDOWN_WAIT_S when the collector is down."""
    worker = threading.Thread(target=provider.shutdown, name="otel-shutdown", daemon=True)
    worker.start()
    worker.join(SHUTDOWN_WAIT_S)
