"""One request's way through the router as phases in a row, each ending where the next
begins: what GET /debug/requests/{id} shows and the spans a traced request sends.

The phases of a disaggregated request: receive (read and check the body), admission (wait
for a slot), tokenize (chat template and tokenizer), route (pick a prefill node), prefill
(on that node, until token 1), respond (token 1 to the client), route (pick a decode node),
import (the decode node queues, reads the KV and admits it), decode (tokens stream until the
end). Because the phases touch, their spans add up to the time from arrival to any mark:
the TTFT (the first chunk with text sent to the client) is the phases before it plus the
part of the one it fell in.

The root span `splitserve.request` continues the client's `traceparent`; the `stream` span
(detokenize and send, from token 1 to the end) runs beside the decode phases.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cluster.tracing import NO_TRACER, Attributes, Span, Tracer, now_ns

READING = {  # the words /debug/requests shows for a phase
    "receive": "receiving the request",
    "admission": "waiting for admission",
    "tokenize": "applying the template and tokenizing",
    "route": "choosing a node",
    "prefill": "prefilling on {node}",
    "respond": "sending token 1",
    "import": "waiting for import on {node}",
    "decode": "decoding on {node}",
}


@dataclass
class Phase:
    """One phase: wall-clock ns (time.time_ns()); `end_ns` None while it runs."""

    name: str
    start_ns: int
    node: str | None = None
    end_ns: int | None = None

    def reading(self) -> str:
        return READING.get(self.name, self.name).format(node=self.node)

    def as_dict(self, now: int) -> dict[str, object]:
        end = self.end_ns if self.end_ns is not None else now
        return {"phase": self.name, "node": self.node, "ms": round((end - self.start_ns) / 1e6, 3)}


@dataclass
class Trail:
    """A request's phases, the marks the client sees (first and last chunk with text) and
    its spans. Every method is cheap when the tracer is off."""

    request_id: str  # x-request-id: the client's own, or the router's
    arrived_ns: int
    tracer: Tracer = NO_TRACER
    root: Span = field(default_factory=Span)
    phases: list[Phase] = field(default_factory=list)
    internal_id: str | None = None  # the id the nodes know the request by
    first_text_ns: int | None = None
    last_text_ns: int | None = None
    text_chunks: int = 0
    completion_tokens: int = 0
    outcome: str | None = None  # None while in flight; "ok" or an error code after
    _span: Span = field(default_factory=Span)  # the current phase's
    _stream: Span = field(default_factory=Span)
    _streaming: bool = False

    @classmethod
    def begin(
        cls, tracer: Tracer, request_id: str, headers: Mapping[str, str], arrived_ns: int
    ) -> Trail:
        """A trail in phase `receive` since `arrived_ns`, under the client's trace context
        when its headers carry one."""
        root = tracer.start(
            "splitserve.request", headers, arrived_ns, {"splitserve.request_id": request_id}
        )
        trail = cls(request_id, arrived_ns, tracer, root)
        trail.enter("receive", at_ns=arrived_ns)
        return trail

    def sample(self, index: int, request_id: str) -> Trail:
        """The trail of sample `index` (flow request `request_id`) of an n > 1 request: a
        `router.sample` span under the current phase's (`router.samples`) holds its phases,
        so each choice's prefill, import and decode land in this request's trace."""
        at = now_ns()
        attrs: Attributes = {"splitserve.sample": index, "splitserve.internal_id": request_id}
        root = self.tracer.start("router.sample", self._span, at, attrs)
        return Trail(request_id, self.arrived_ns, self.tracer, root)

    @property
    def current(self) -> Phase | None:
        return self.phases[-1] if self.phases else None

    def enter(
        self,
        name: str,
        node: str | None = None,
        attrs: Attributes | None = None,
        at_ns: int | None = None,
    ) -> Span:
        """End the current phase and begin `name` at the same instant; its span (whose
        headers carry the context to `node`)."""
        at = now_ns() if at_ns is None else at_ns
        self._close_phase(at)
        self.phases.append(Phase(name, at, node))
        span_attrs = dict(attrs or {})
        if node is not None:
            span_attrs["splitserve.node_id"] = node
        self._span = self.tracer.start(f"router.{name}", self.root, at, span_attrs)
        return self._span

    def annotate(self, attrs: Attributes) -> None:
        """Attributes of the current phase's span."""
        self._span.set(attrs)

    def token_one(self) -> None:
        """Token 1 is here: the `respond` phase (send it) and the `stream` span (detokenize
        and send every token) begin."""
        if not self._streaming:
            self._streaming = True
            self.enter("respond")
            self._stream = self.tracer.start("router.stream", self.root, now_ns())

    def sent_text(self) -> None:
        """A chunk with text went to the client."""
        at = now_ns()
        if self.first_text_ns is None:
            self.first_text_ns = at
            self.root.event("first_token", at)
        self.last_text_ns = at
        self.text_chunks += 1

    def finish(self, outcome: str, completion_tokens: int = 0) -> None:
        """The response is over (`outcome`: ok, or why not): spans end with their times."""
        if self.outcome is not None:
            return
        self.outcome = outcome
        self.completion_tokens = completion_tokens
        at = now_ns()
        self._close_phase(at)
        self._stream.set({"splitserve.chunks": self.text_chunks})
        self._stream.end(at)
        self.root.set(self.summary())
        self.root.end(at)

    def summary(self) -> dict[str, str | int | float]:
        """TTFT and TPOT as the bench client measures them (chunks with text), in ms."""
        out: dict[str, str | int | float] = {"splitserve.outcome": self.outcome or "running"}
        out["splitserve.completion_tokens"] = self.completion_tokens
        if self.internal_id:
            out["splitserve.internal_id"] = self.internal_id
        if self.first_text_ns is not None:
            out["splitserve.ttft_ms"] = (self.first_text_ns - self.arrived_ns) / 1e6
            if self.last_text_ns is not None and self.completion_tokens > 1:
                decode_ns = self.last_text_ns - self.first_text_ns
                out["splitserve.tpot_ms"] = decode_ns / 1e6 / (self.completion_tokens - 1)
        return out

    def view(self) -> dict[str, object]:
        """What /debug/requests shows: the state now, or the finished request's timings."""
        now = now_ns()
        current = self.current
        out: dict[str, object] = {
            "request_id": self.request_id,
            "internal_id": self.internal_id,
            "state": "finished" if self.outcome else (current.reading() if current else "new"),
            "node": current.node if current else None,
            "phase": current.name if current else None,
            "in_phase_ms": round((now - current.start_ns) / 1e6, 3) if current else 0.0,
            "age_ms": round((now - self.arrived_ns) / 1e6, 3),
            "phases": [p.as_dict(now) for p in self.phases],
        }
        out.update(self.summary())
        return out

    def _close_phase(self, at: int) -> None:
        current = self.current
        if current is not None and current.end_ns is None:
            current.end_ns = at
            self._span.end(at)
