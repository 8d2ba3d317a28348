"""bench.peers' report: each system's label, our ratio to each peer per round, and the text
table of a run."""

from __future__ import annotations

from typing import Any

LABELS = {
    "splitserve": "splitserve (packed GGUF)",
    "splitserve_int8": "splitserve (packed GGUF, int8_activations)",
    "splitserve_fp32": "splitserve (fp32)",
    "vllm": "vLLM-CPU",
    "llama_cpp": "llama.cpp",
}


def ratios(rounds: list[dict[str, Any]], workload: str) -> dict[str, list[float | None]]:
    """Each of our packed systems' output tok/s over each peer's, per round, keyed
    ``ours/peer``."""
    out: dict[str, list[float | None]] = {}
    for ours_name in ("splitserve", "splitserve_int8"):
        for peer in ("vllm", "llama_cpp"):
            per_round = []
            for entry in rounds:
                ours, theirs = entry[workload].get(ours_name, {}), entry[workload].get(peer)
                ok = theirs is not None and "out_tok_s" in theirs and "out_tok_s" in ours
                per_round.append(ours["out_tok_s"] / theirs["out_tok_s"] if ok else None)
            if any(r is not None for r in per_round):
                out[f"{ours_name}/{peer}"] = per_round
    return out


def _label(name: str, results: list[dict[str, Any]]) -> str:
    label = LABELS[name]
    version = next((r["version"] for r in results if "version" in r), None)
    label += f" {version}" if version else ""
    if any(r.get("mode") == "no_extra_bufts" for r in results):
        label += " (no extra bufts: default crashed)"
    return label


def _cell(result: dict[str, Any]) -> str:
    if "out_tok_s" not in result:
        return f"{'failed':>9}"
    cpu = f" ({result['out_tok_cpu_s']:.1f})" if "out_tok_cpu_s" in result else ""
    return f"{result['out_tok_s']:9.1f}{cpu}"


def table(report: dict[str, Any]) -> str:
    """The report as one text table: out tok/s per round, then the ratios and the limits."""
    rounds = report["rounds"]
    head = "".join(f"  round {i + 1}" for i in range(len(rounds)))
    lines = [f"{'workload':<9} {'system':<52}{head}  (output tok/s; a CPU-second's)"]
    for workload in report["workloads"]:
        for name in rounds[0][workload]:
            results = [entry[workload][name] for entry in rounds]
            cells = "".join(f"  {_cell(r)}" for r in results)
            lines.append(f"{workload:<9} {_label(name, results):<52}{cells}")
        for pair, per in report["ratios"][workload].items():
            ours, peer = pair.split("/")
            cells = "".join(f"  {r:8.2f}x" if r is not None else f"  {'-':>9}" for r in per)
            name = ("splitserve int8" if ours == "splitserve_int8" else "splitserve") + " / "
            lines.append(f"{workload:<9} {name + LABELS[peer]:<52}{cells}")
    for key, unit in (("fp32_matmul_peak_gflop_s", "GFLOP/s"), ("copy_gb_s", "GB/s"),
                      ("load_1m", "")):  # fmt: skip
        cells = "".join(f"  {entry['limits'][key]:9.1f}" for entry in rounds)
        lines.append(f"{'limits':<9} {key + (' ' + unit if unit else ''):<52}{cells}")
    for name, why in report["left_out"].items():
        lines.append(f"left out: {LABELS[name]}: {why}")
    for workload in report["workloads"]:
        for name, result in rounds[-1][workload].items():
            if "error" in result:
                lines.append(f"failed: {workload} on {LABELS[name]}: {result['error'][-300:]}")
    return "\n".join(lines)
