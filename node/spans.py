"""A request's spans on a node: children of the caller's span, whose W3C trace context came
in the request's headers. Times are the node's time.monotonic() stamps; every call does
nothing when tracing is off."""

from __future__ import annotations

from collections.abc import Mapping

from cluster.tracing import NO_TRACER, Attributes, Span, Tracer, trace_context, wall_ns
from kv_transfer.transport import Served, ServedHook


class NodeSpans:
    """Records spans that already ended under one parent (the caller's span)."""

    def __init__(self, tracer: Tracer = NO_TRACER, headers: Mapping[str, str] | None = None):
        self.tracer = tracer
        self._parent = trace_context(headers) if headers is not None and tracer.enabled else {}

    @property
    def on(self) -> bool:
        return self.tracer.enabled and bool(self._parent)

    def start(
        self, name: str, start: float, attrs: Attributes | None = None, parent: Span | None = None
    ) -> Span:
        """A span begun at `start` (time.monotonic()), still open, under `parent` or the
        caller's: its headers() carry it to another process."""
        if not self.on:
            return Span()
        under = parent if parent is not None else self._parent
        return self.tracer.start(name, under, wall_ns(start), attrs)

    def record(
        self,
        name: str,
        start: float,
        end: float,
        attrs: Attributes | None = None,
        parent: Span | None = None,
    ) -> Span:
        """A span from `start` to `end` (time.monotonic()), under `parent` or the caller's."""
        if not self.on:
            return Span()
        under = parent if parent is not None else self._parent
        return self.tracer.record(name, under, wall_ns(start), wall_ns(end), attrs)


def kv_send_spans(tracer: Tracer, name: str) -> ServedHook:
    """Records `name` for each READ this node served over TCP, as a child of the reader's
    transfer span (whose context the READ message carried)."""

    def record(served: Served) -> None:
        seconds = served.end - served.start
        attrs: dict[str, str | int | float] = {
            "splitserve.internal_id": served.request_id,
            "splitserve.bytes": served.nbytes,
        }
        if seconds > 0:
            attrs["splitserve.gbps"] = served.nbytes / seconds / 1e9
        tracer.record(name, served.trace, wall_ns(served.start), wall_ns(served.end), attrs)

    return record
