"""Serving benchmark statistics from per-request records (dicts as written to the JSON):
percentiles, throughput, goodput under a TTFT + TPOT SLO, the printed tables and `--compare`.

Goodput = requests per second (over the point's duration) that completed with TTFT <= the
TTFT SLO and TPOT <= the TPOT SLO; a request with one output token has no TPOT and is judged
on TTFT alone. Failed requests count in the totals but never in latency statistics.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

METRICS = ("ttft", "tpot", "itl", "e2e")
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class SLO:
    ttft_ms: float
    tpot_ms: float

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"SLO.{name} must be > 0, got {value}")

    def met_by(self, record: dict[str, Any]) -> bool:
        if record["error"] is not None or record["ttft"] is None:
            return False
        tpot = record["tpot"]
        return record["ttft"] * 1e3 <= self.ttft_ms and (tpot is None or tpot * 1e3 <= self.tpot_ms)


def _distribution(values_s: list[float]) -> dict[str, float | None]:
    if not values_s:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    ms = np.asarray(values_s) * 1e3
    return {"mean": float(ms.mean()), **{f"p{p}": float(np.percentile(ms, p)) for p in PERCENTILES}}


def _values(records: list[dict[str, Any]], metric: str) -> list[float]:
    if metric == "itl":
        return [gap for r in records for gap in r["itl"]]
    return [r[metric] for r in records if r[metric] is not None]


def summarize(
    records: list[dict[str, Any]], duration_s: float, rate: float | None, slo: SLO
) -> dict[str, Any]:
    """The summary of one sweep point."""
    ok = [r for r in records if r["error"] is None]
    good = sum(slo.met_by(r) for r in records)
    secs = max(duration_s, 1e-9)
    summary: dict[str, Any] = {
        "offered_rate": rate,
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": duration_s,
        "request_throughput": len(ok) / secs,
        "input_token_throughput": sum(r["prompt_tokens"] for r in ok) / secs,
        "output_token_throughput": sum(r["output_tokens"] for r in ok) / secs,
        "goodput": good / secs,
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
        "slo_attainment": good / len(records) if records else 0.0,
        "errors": dict(Counter(r["error"] for r in records if r["error"]).most_common(5)),
    }
    for metric in METRICS:
        summary[f"{metric}_ms"] = _distribution(_values(records, metric))
    return summary


def resummarize(result: dict[str, Any], slo: SLO) -> dict[str, Any]:
    """A loaded result with every point's summary recomputed under `slo`."""
    points = [
        {**p, "summary": summarize(p["records"], p["duration_s"], p["rate"], slo)}
        for p in result["points"]
    ]
    return {**result, "points": points}


def best_goodput(result: dict[str, Any]) -> tuple[float, float | None]:
    """(highest goodput of the sweep, the offered rate it came at)."""
    best = max(result["points"], key=lambda p: p["summary"]["goodput"], default=None)
    return (0.0, None) if best is None else (best["summary"]["goodput"], best["rate"])


def rate_label(rate: float | None) -> str:
    return "inf" if rate is None else f"{rate:g}"


def point_label(point: dict[str, Any]) -> str:
    """A point as reports name it: its offered rate (`inf`: all at once), or the phases of a
    --rate-schedule run as RATE:SECONDS,..."""
    phases = point.get("phases")
    if phases:
        return ",".join(_phase_label(phase) for phase in phases)
    return rate_label(point["rate"])


def _phase_label(phase: dict[str, Any]) -> str:
    return f"{phase['rate']:g}:{phase['seconds']:g}"


def _rows(point: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, summary) per table row: a rate schedule's phases, then the whole run."""
    phases = point.get("phases")
    if not phases:
        return [(rate_label(point["rate"]), point["summary"])]
    return [*((_phase_label(p), p["summary"]) for p in phases), ("all", point["summary"])]


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def point_report(summary: dict[str, Any]) -> str:
    """Latency percentiles and throughput of one point, as printed after it runs."""
    s, slo = summary, summary["slo"]
    lines = [
        f"rate {rate_label(s['offered_rate'])} req/s: {s['num_requests']} requests, "
        f"{s['completed']} ok, {s['failed']} failed, {s['duration_s']:.1f} s",
        f"  {'(ms)':<6}{'mean':>9}{'p50':>9}{'p90':>9}{'p99':>9}",
    ]
    for metric in METRICS:
        d = s[f"{metric}_ms"]
        cells = "".join(f"{_fmt(d[k]):>9}" for k in ("mean", "p50", "p90", "p99"))
        lines.append(f"  {metric.upper():<6}{cells}")
    lines.append(
        f"  throughput {s['request_throughput']:.2f} req/s, "
        f"{s['output_token_throughput']:.1f} output tok/s; goodput {s['goodput']:.2f} req/s "
        f"({s['slo_attainment']:.0%} within TTFT <= {slo['ttft_ms']:g} ms and "
        f"TPOT <= {slo['tpot_ms']:g} ms)"
    )
    if s["offered_rate"]:
        lines.append(
            f"  achieved / offered rate: {s['request_throughput'] / s['offered_rate']:.2f}"
        )
    lines += [f"  error x{n}: {msg}" for msg, n in s["errors"].items()]
    return "\n".join(lines)


def sweep_table(result: dict[str, Any]) -> str:
    """One line per rate, then the best goodput; a rate schedule: one line per phase (as
    RATE:SECONDS), then the whole run."""
    head = (
        f"{'rate':>6} {'ok/all':>8} {'req/s':>7} {'tok/s':>8} {'goodput':>8} {'SLO%':>5} "
        f"{'TTFT p50':>9} {'p99':>8} {'TPOT p50':>9} {'p99':>7}"
    )
    lines = [head]
    rows = [row for p in result["points"] for row in _rows(p)]
    for label, s in rows:
        ttft, tpot = s["ttft_ms"], s["tpot_ms"]
        lines.append(
            f"{label:>6} {s['completed']:>4}/{s['num_requests']:<3} "
            f"{s['request_throughput']:>7.2f} {s['output_token_throughput']:>8.1f} "
            f"{s['goodput']:>8.2f} {s['slo_attainment']:>5.0%} {_fmt(ttft['p50']):>9} "
            f"{_fmt(ttft['p99']):>8} {_fmt(tpot['p50']):>9} {_fmt(tpot['p99']):>7}"
        )
    if len(rows) > len(result["points"]):  # a rate schedule: no sweep to pick a best from
        return "\n".join(lines)
    goodput, at = best_goodput(result)
    lines.append(f"best goodput {goodput:.2f} req/s at rate {rate_label(at)}")
    return "\n".join(lines)


# (row label, path into a summary, decimals)
_COMPARED: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("req/s", ("request_throughput",), 2),
    ("output tok/s", ("output_token_throughput",), 1),
    ("goodput req/s", ("goodput",), 2),
    ("SLO attainment", ("slo_attainment",), 2),
    *((f"{m.upper()} {q} ms", (f"{m}_ms", q), 1) for m in METRICS for q in ("p50", "p90", "p99")),
    ("failed", ("failed",), 0),
)


def _get(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        value = value[key]
    return None if value is None else float(value)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0:
        return "-"
    return f"{b / a:.2f}x"


def _same_rate(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9)


def compare_table(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> str:
    """Side by side per rate both files share, then best goodput; ratio column is B/A."""
    w = max(12, *(len(n) for n in names))
    head = f"{'':<16}{names[0]:>{w}}{names[1]:>{w}}{'B/A':>9}"
    lines = [f"A = {names[0]}, B = {names[1]}"]
    slo = next((p["summary"]["slo"] for p in a["points"]), None)
    if slo:
        lines.append(f"goodput SLO: TTFT <= {slo['ttft_ms']:g} ms, TPOT <= {slo['tpot_ms']:g} ms")
    for pa in a["points"]:
        pb = next((p for p in b["points"] if _same_rate(p["rate"], pa["rate"])), None)
        if pb is None:
            continue
        lines += ["", f"rate {rate_label(pa['rate'])} req/s", head]
        for label, path, digits in _COMPARED:
            va, vb = _get(pa["summary"], path), _get(pb["summary"], path)
            cells = f"{_fmt(va, digits):>{w}}{_fmt(vb, digits):>{w}}"
            lines.append(f"{label:<16}{cells}{_ratio(va, vb):>9}")
    if not any(line.startswith("rate ") for line in lines):
        lines.append("(no offered rate in common)")
    (ga, ra), (gb, rb) = best_goodput(a), best_goodput(b)
    lines += [
        "",
        f"{'best goodput':<16}{ga:>{w}.2f}{gb:>{w}.2f}{_ratio(ga, gb):>9}",
        f"{'  at rate':<16}{rate_label(ra):>{w}}{rate_label(rb):>{w}}",
    ]
    return "\n".join(lines)
