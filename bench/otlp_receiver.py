"""An OTLP/HTTP traces receiver for tests and benchmarks: decodes the real protobuf
and keeps every span with its service."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    instance: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any]

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _span(resource: dict[str, Any], s: Any) -> ReceivedSpan:
    return ReceivedSpan(
        str(resource.get("service.name")), str(resource.get("service.instance.id")),
        s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
        s.start_time_unix_nano, s.end_time_unix_nano,
        {a.key: _value(a.value) for a in s.attributes},
    )  # fmt: skip


def _decode(body: bytes) -> list[ReceivedSpan]:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    got: list[ReceivedSpan] = []
    for rs in req.resource_spans:
        res = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            got.extend(_span(res, s) for s in ss.spans)
    return got


class OtlpReceiver:
    """Listens on 127.0.0.1 (a free port) until `close()`. Bodies are decoded when the spans
    are read, not on arrival: a test that times requests in this process is not held up."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._bodies: list[bytes] = []
        self.posts = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver._take(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _take(self, body: bytes) -> None:
        with self._lock:
            self.posts += 1
            self._bodies.append(body)

    @property
    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far."""
        with self._lock:
            bodies, self._bodies = self._bodies, []
            for body in bodies:
                self._spans.extend(_decode(body))
            return list(self._spans)

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 60.0
    ) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.spans
            if found(spans):
                return spans
            time.sleep(0.1)
        raise AssertionError(f"spans never arrived; have {sorted({s.name for s in spans})}")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def trace_of(spans: list[ReceivedSpan], request_id: str) -> list[ReceivedSpan]:
    """The spans of the trace whose root `splitserve.request` names `request_id` (empty
    until exactly one such root is in: it ends last)."""
    roots = [s for s in spans if s.name == "splitserve.request"
             and s.attrs.get("splitserve.request_id") == request_id]  # fmt: skip
    if len(roots) != 1:
        return []
    return [s for s in spans if s.trace_id == roots[0].trace_id]
