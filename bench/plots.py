"""PNG plots of serving benchmark results (matplotlib, no display needed).

    python -m bench.plots A.json [B.json ...] --out DIR

Per result: TTFT and TPOT CDFs, one line per offered rate. Across results: goodput and
request throughput against offered rate on one chart (e.g. disaggregated vs colocated).
Points sent all at once (rate inf) have no place on a rate axis and are left off it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.serve_stats import SLO, point_label, resummarize


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "result"


def plot_latency_cdfs(result: dict[str, Any], label: str, out_dir: Path) -> Path:
    """TTFT and TPOT empirical CDFs of every point of one result."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric in zip(axes, ("ttft", "tpot"), strict=True):
        for point in result["points"]:
            ms = np.sort([r[metric] * 1e3 for r in point["records"] if r[metric] is not None])
            if ms.size:
                cdf = np.arange(1, ms.size + 1) / ms.size
                ax.step(ms, cdf, where="post", label=f"rate {point_label(point)}")
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"{label}: latency CDFs")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{_slug(label)}_latency_cdf.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_goodput(results: dict[str, dict[str, Any]], out_dir: Path) -> Path:
    """Goodput (solid) and request throughput (dashed) against offered rate, per result."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    slos = {label: _slo_text(r) for label, r in results.items()}
    shared = len(set(slos.values())) == 1
    top = 0.0
    for label, result in results.items():
        points = sorted((p for p in result["points"] if p["rate"] is not None), key=_rate)
        rates = [p["rate"] for p in points]
        name = label if shared else f"{label} ({slos[label]})"
        line = ax.plot(rates, [p["summary"]["goodput"] for p in points], "o-", label=name)
        throughput = [p["summary"]["request_throughput"] for p in points]
        ax.plot(rates, throughput, "x--", color=line[0].get_color(), alpha=0.5)
        top = max(top, *rates, 0.0)
    ax.plot([0, top], [0, top], ":", color="grey", linewidth=1, label="offered")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("req/s (solid: goodput, dashed: throughput)")
    title = "goodput vs rate"
    if shared and slos:
        title += f" ({next(iter(slos.values()))})"
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "goodput_vs_rate.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _slo_text(result: dict[str, Any]) -> str:
    slo = next((p["summary"]["slo"] for p in result["points"]), None)
    return "" if slo is None else f"TTFT <= {slo['ttft_ms']:g} ms, TPOT <= {slo['tpot_ms']:g} ms"


def _rate(point: dict[str, Any]) -> float:
    return float(point["rate"])


def plot_all(results: dict[str, dict[str, Any]], out_dir: Path) -> list[Path]:
    """Every plot for `results` (label -> loaded result)."""
    paths = [plot_latency_cdfs(r, label, out_dir) for label, r in results.items()]
    return [*paths, plot_goodput(results, out_dir)]


def load_results(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """label -> result for bench serve JSON files; the label is the run's --label, else the
    file name, made unique."""
    results: dict[str, dict[str, Any]] = {}
    for path in paths:
        result = json.loads(Path(path).read_text())
        label = str(result.get("config", {}).get("label") or Path(path).stem)
        unique, n = label, 2
        while unique in results:
            unique, n = f"{label}-{n}", n + 1
        results[unique] = result
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("results", nargs="+", type=Path, help="bench serve JSON files")
    ap.add_argument("--out", type=Path, required=True, help="directory for the PNG files")
    ap.add_argument("--slo-ttft-ms", type=float, help="recompute goodput with this TTFT SLO")
    ap.add_argument("--slo-tpot-ms", type=float, help="... and this TPOT SLO (both needed)")
    args = ap.parse_args(argv)
    results = load_results(args.results)
    if (args.slo_ttft_ms is None) != (args.slo_tpot_ms is None):
        ap.error("give both --slo-ttft-ms and --slo-tpot-ms, or neither")
    if args.slo_ttft_ms is not None:
        slo = SLO(args.slo_ttft_ms, args.slo_tpot_ms)
        results = {label: resummarize(r, slo) for label, r in results.items()}
    for png in plot_all(results, args.out):
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
