"""The OpenTelemetry side of cluster.tracing: imported only by a process that traces."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from cluster.trace_api import Attributes, Parent, Span, TraceConfig, Tracer, shutdown_bounded

_PROPAGATOR = TraceContextTextMapPropagator()
EXPORT_TIMEOUT_S = 5.0  # one export call; the batch thread drops a batch that fails


class OtelSpan(Span):
    """An OpenTelemetry span (sampled or not: an unsampled one still carries the context)."""

    def __init__(self, span: Any) -> None:
        self._span = span
        self._ended = False
        self.recording = bool(span.is_recording())

    def set(self, attrs: Attributes) -> None:
        if self.recording:
            self._span.set_attributes(dict(attrs))

    def event(self, name: str, at_ns: int | None = None, attrs: Attributes | None = None) -> None:
        if self.recording:
            self._span.add_event(name, dict(attrs or {}), timestamp=at_ns)

    def end(self, at_ns: int | None = None) -> None:
        if not self._ended:
            self._ended = True
            self._span.end(end_time=at_ns)

    def headers(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(self._span))
        return carrier

    @property
    def context(self) -> Any:
        return trace.set_span_in_context(self._span)


class OtelTracer(Tracer):
    enabled = True

    def __init__(self, config: TraceConfig, url: str, protocol: str) -> None:
        resource = Resource.create(
            {
                "service.name": config.service,
                "service.instance.id": config.instance,
                "splitserve.node_id": config.instance,
            }
        )
        sampler = ParentBased(TraceIdRatioBased(config.ratio))
        self._provider = TracerProvider(resource=resource, sampler=sampler)
        self._provider.add_span_processor(BatchSpanProcessor(_exporter(url, protocol)))
        self._tracer = self._provider.get_tracer("splitserve")

    def start(
        self,
        name: str,
        parent: Parent = None,
        at_ns: int | None = None,
        attrs: Attributes | None = None,
    ) -> Span:
        span = self._tracer.start_span(
            name, context=_context(parent), start_time=at_ns, attributes=dict(attrs or {})
        )
        return OtelSpan(span)

    def shutdown(self) -> None:
        shutdown_bounded(self._provider)


def _context(parent: Parent) -> Any:
    if parent is None:
        return None
    if isinstance(parent, OtelSpan):
        return parent.context
    if isinstance(parent, Span):  # a do-nothing span: no parent
        return None
    if isinstance(parent, Mapping):
        return _PROPAGATOR.extract({k.lower(): v for k, v in parent.items()})
    return None


def _exporter(url: str, protocol: str) -> Any:
    if protocol == "grpc":  # optional: opentelemetry-exporter-otlp-proto-grpc
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=url, timeout=int(EXPORT_TIMEOUT_S))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=url, timeout=EXPORT_TIMEOUT_S)
