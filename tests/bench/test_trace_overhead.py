"""bench.trace_overhead's pieces: the span sink counts what an exporter sends, and the
comparison reports tracing's added TTFT and TPOT p50."""

from __future__ import annotations

import os
import time

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.trace_overhead import SpanSink, compare, cpu_seconds
from bench.trace_overhead_report import cpu_table, verdict


def _record(ttft_s: float, tpot_s: float) -> dict[str, object]:
    return {"error": None, "prompt_tokens": 8, "output_tokens": 4, "ttft": ttft_s,
            "tpot": tpot_s, "itl": [tpot_s] * 3, "e2e": ttft_s + 3 * tpot_s}  # fmt: skip


def test_the_sink_counts_the_spans_it_is_sent() -> None:
    req = ExportTraceServiceRequest()
    scope = req.resource_spans.add().scope_spans.add()
    for name in ("a", "b", "c"):
        scope.spans.add(name=name)
    sink = SpanSink()
    try:
        for _ in range(2):
            resp = httpx.post(sink.url + "/v1/traces", content=req.SerializeToString(),
                              headers={"content-type": "application/x-protobuf"},
                              trust_env=False)  # fmt: skip
            assert resp.status_code == 200
        assert sink.spans == 6
    finally:
        sink.close()


def test_compare_reports_what_tracing_added() -> None:
    records = {
        "on": [_record(0.103, 0.0202), _record(0.105, 0.0204), _record(0.107, 0.0206)],
        "off": [_record(0.100, 0.0200), _record(0.102, 0.0200), _record(0.104, 0.0200)],
    }
    report = compare(records, {"on": 3.0, "off": 3.0})
    assert report["ttft_p50_added_ms"] == 3.0
    assert report["tpot_p50_added_ms"] == 0.4
    assert report["tpot_p50_added_pct"] == 2.0
    assert report["on"]["completed"] == report["off"]["completed"] == 3


def test_cpu_seconds_grow_with_work() -> None:
    before = cpu_seconds([os.getpid()])
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # 50 ms of CPU
        pass
    assert cpu_seconds([os.getpid()]) - before >= 0.03


def _round(on: tuple[float, float], off: tuple[float, float]) -> dict[str, dict[str, float]]:
    return {"on": {"ttft": on[0], "tpot": on[1]}, "off": {"ttft": off[0], "tpot": off[1]}}


def test_the_verdict_is_the_median_of_the_rounds_differences() -> None:
    steady = [_round((102, 20.2), (100, 20.0)), _round((101, 20.3), (100, 20.0)),
              _round((150, 20.1), (100, 20.0))]  # fmt: skip
    v = verdict(steady)  # one round's outlier (+50 ms) does not move the median
    assert v["added"]["ttft_ms"] == 2.0 and round(v["added"]["tpot_pct"], 6) == 1.0
    assert v["verdict"] == "holds"
    slower = [_round((110, 21.0), (100, 20.0)), _round((111, 21.0), (100, 20.0))]
    assert verdict(slower)["verdict"] == "exceeded"
    noisy = [_round((140, 20.0), (100, 20.0)), _round((60, 20.0), (100, 20.0))]
    assert verdict(noisy)["verdict"] == "inconclusive"  # rounds differ by +-40 ms
    assert verdict(steady[:1])["verdict"] == "inconclusive"  # no noise from one round


def test_cpu_is_counted_per_request_and_per_token_of_each_process() -> None:
    records = {"on": [_record(0.1, 0.02)] * 4, "off": [_record(0.1, 0.02)] * 4}
    table = cpu_table({"on": {"router": 0.4, "decode-0": 1.6}, "off": {"router": 0.2}}, records)
    assert table["on"]["router"] == {"ms_per_request": 100.0, "ms_per_token": 25.0}
    assert table["on"]["decode-0"]["ms_per_token"] == 100.0  # 4 requests x 4 tokens
    assert table["off"]["router"]["ms_per_request"] == 50.0
