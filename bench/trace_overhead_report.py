"""bench.trace_overhead's verdict: tracing's added TTFT and TPOT p50 as the median over rounds
of each round's on - off difference, the noise those differences show, CPU time per request
and per token of each serving process, and whether the bound holds."""

from __future__ import annotations

import statistics
from typing import Any

from bench.serve import DEFAULT_SLO
from bench.serve_stats import summarize

MODES = ("on", "off")
BOUND = {"ttft_ms": 5.0, "tpot_pct": 3.0}  # issue 46: tracing at ratio 1.0 adds at most this


def compare(
    records: dict[str, list[dict[str, Any]]], durations: dict[str, float]
) -> dict[str, Any]:
    """Per mode the pooled summary; tracing's difference in TTFT and TPOT p50."""
    out: dict[str, Any] = {
        mode: summarize(records[mode], durations[mode], None, DEFAULT_SLO) for mode in MODES
    }
    on, off = out["on"], out["off"]
    ttft = on["ttft_ms"]["p50"] - off["ttft_ms"]["p50"]
    tpot = on["tpot_ms"]["p50"] - off["tpot_ms"]["p50"]
    out["ttft_p50_added_ms"] = round(ttft, 3)
    out["tpot_p50_added_ms"] = round(tpot, 3)
    out["tpot_p50_added_pct"] = round(100 * tpot / off["tpot_ms"]["p50"], 2)
    return out


def round_differences(rounds: list[dict[str, dict[str, float]]]) -> dict[str, list[float]]:
    """Each round's on - off: TTFT p50 in ms, TPOT p50 in % of off's."""
    return {
        "ttft_ms": [r["on"]["ttft"] - r["off"]["ttft"] for r in rounds],
        "tpot_pct": [100 * (r["on"]["tpot"] - r["off"]["tpot"]) / r["off"]["tpot"] for r in rounds],
    }


def verdict(rounds: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """The median difference per metric, its noise (median absolute deviation of the rounds'
    differences; unknown from one round) and the verdict: `holds`, `exceeded`, or
    `inconclusive` where the noise is larger than the bound."""
    diffs = round_differences(rounds)
    added = {k: statistics.median(v) for k, v in diffs.items()}
    noise = {k: _mad(v) for k, v in diffs.items()}
    if any(noise[k] is None or noise[k] > BOUND[k] for k in BOUND):  # type: ignore[operator]
        word = "inconclusive"
    elif all(added[k] <= BOUND[k] for k in BOUND):
        word = "holds"
    else:
        word = "exceeded"
    return {"added": added, "noise": noise, "bound": BOUND, "verdict": word, "rounds": diffs}


def _mad(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    mid = statistics.median(values)
    return statistics.median(abs(v - mid) for v in values)


def cpu_table(
    cpu: dict[str, dict[str, float]], records: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, dict[str, float]]]:
    """Per mode and process: CPU ms per request and per output token."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for mode, by_proc in cpu.items():
        ok = [r for r in records[mode] if r["error"] is None]
        requests, tokens = max(len(ok), 1), max(sum(r["output_tokens"] for r in ok), 1)
        out[mode] = {
            name: {
                "ms_per_request": round(1e3 * s / requests, 2),
                "ms_per_token": round(1e3 * s / tokens, 3),
            }
            for name, s in by_proc.items()
        }
    return out


def lines(report: dict[str, Any]) -> list[str]:
    """What the benchmark prints."""
    v, med = report["verdict"], report["median_round_p50_ms"]
    noise = {k: "unknown" if n is None else f"{n:.2f}" for k, n in v["noise"].items()}
    out = [
        f"median of {len(v['rounds']['ttft_ms'])} rounds' p50: TTFT on {med['on']['ttft']:.1f} "
        f"off {med['off']['ttft']:.1f} ms; TPOT on {med['on']['tpot']:.2f} "
        f"off {med['off']['tpot']:.2f} ms",
        f"tracing adds (median of the rounds' on - off): TTFT {v['added']['ttft_ms']:+.2f} ms "
        f"(noise {noise['ttft_ms']} ms), TPOT {v['added']['tpot_pct']:+.2f}% "
        f"(noise {noise['tpot_pct']}%)",
    ]
    for mode, by_proc in report["cpu"].items():
        parts = [f"{name} {c['ms_per_request']:.1f} ms/req {c['ms_per_token']:.2f} ms/token"
                 for name, c in by_proc.items()]  # fmt: skip
        out.append(f"CPU tracing {mode}: " + "; ".join(parts))
    bound = v["bound"]
    out.append(
        f"bound (TTFT p50 +{bound['ttft_ms']:g} ms, TPOT p50 +{bound['tpot_pct']:g}%): "
        f"{v['verdict']}; {report['spans_received']} spans received"
    )
    load, cpus = report["load_average_before_after"], report["cpus"]
    if max(load[0][0], load[1][0]) > cpus / 2:
        out.append(
            f"the machine was loaded (load average {load[0][0]:.1f} -> {load[1][0]:.1f} on "
            f"{cpus} CPUs): do not quote these figures; run on a quiet machine"
        )
    return out
