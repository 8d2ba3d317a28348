"""bench.trace_svg draws one trace: a row per span, children under their parent in start
order, each bar where its span lies on the time axis, coloured by process."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from bench.otlp_receiver import ReceivedSpan
from bench.trace_svg import COLOURS, LABELS, RIGHT, WIDTH, in_order, render, tick_ms

SVG = "{http://www.w3.org/2000/svg}"
MS = 1_000_000


def _span(name: str, sid: str, parent: str, start_ms: float, end_ms: float,
          service: str = "splitserve-router", **attrs: object) -> ReceivedSpan:  # fmt: skip
    return ReceivedSpan(service, "n0", name, "t1", sid, parent, int(start_ms * MS),
                        int(end_ms * MS), dict(attrs))  # fmt: skip


TRACE = [
    _span("router.decode", "d", "r", 40, 100),
    _span("splitserve.request", "r", "", 0, 100),
    _span(
        "decode.kv_transfer",
        "k",
        "d",
        42,
        50,
        "splitserve-decode",
        **{"splitserve.bytes": 2_000_000, "splitserve.gbps": 0.25},
    ),
    _span("router.prefill", "p", "r", 5, 40),
    _span("prefill.compute", "c", "p", 10, 38, "splitserve-prefill"),
]


def test_spans_are_drawn_depth_first_in_start_order() -> None:
    rows = [(depth, s.name) for depth, s in in_order(TRACE)]
    assert rows == [(0, "splitserve.request"), (1, "router.prefill"), (2, "prefill.compute"),
                    (1, "router.decode"), (2, "decode.kv_transfer")]  # fmt: skip


def test_each_bar_lies_where_its_span_does() -> None:
    root = ET.fromstring(render(TRACE, "a <trace> & more"))
    bars = [r for r in root.iter(SVG + "rect") if r.find(SVG + "title") is not None]
    assert len(bars) == len(TRACE)
    chart = WIDTH - LABELS - RIGHT
    by_name = {b.find(SVG + "title").text.split()[1]: b for b in bars}  # type: ignore[union-attr]
    compute = by_name["prefill.compute"]
    assert float(compute.get("x", "")) == pytest.approx(LABELS + chart * 0.10, abs=0.1)
    assert float(compute.get("width", "")) == pytest.approx(chart * 0.28, abs=0.1)
    assert compute.get("fill") == COLOURS["splitserve-prefill"]
    texts = [t.text for t in root.iter(SVG + "text")]
    assert "a <trace> & more" in texts  # escaped in the file, itself once parsed
    assert "8.0 ms, 2.0 MB at 0.25 GB/s" in texts  # what the KV read moved, how fast
    assert "0 ms" in texts and "100 ms" in texts  # the axis spans the trace


def test_ticks_are_round() -> None:
    assert tick_ms(100) == 10
    assert tick_ms(29000) == 5000
    assert tick_ms(3.2) == 0.5


def test_an_empty_trace_is_refused() -> None:
    with pytest.raises(ValueError, match="no spans"):
        render([], "empty")
