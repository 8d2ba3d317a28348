"""The table ``bench.weight_only_gemm`` prints: each case's time, weight read over the
same-run copy traffic and FLOP/s over the matmul peak per product, then the speed-ups over
cuBLAS bf16 (``w4a16``: the kernel the engine takes, named; ``tiled``: the tiled int4 kernel
at decode rows, beside the decode kernel), the crossover and the sweep."""

from __future__ import annotations

from typing import Any

KINDS = ("bf16", "w4a16", "w4a16_tiled", "fp8")
SPEEDUPS = (("w4a16", "w4 x"), ("w4a16_tiled", "tiled x"), ("fp8", "fp8 x"))


def _cell(case: dict[str, Any], kind: str, peak: float) -> str:
    r = case.get(kind)
    if r is None:
        return f"{'-':>11}{'-':>10}{'-':>7}"
    return f"{r['time_ms'] * 1e3:>11.1f}{r['read_over_copy']:>10.2f}{r['tflops'] / peak:>7.2f}"


def _speedup(case: dict[str, Any], kind: str, width: int) -> str:
    r = case.get(kind)
    return f"{r['speedup_vs_bf16']:>{width}.2f}" if r else f"{'-':>{width}}"


def case_lines(result: dict[str, Any]) -> list[str]:
    head = f"{'shape':<8}{'M':>6}{'int4':>7}"
    for kind in KINDS:
        head += f"{kind.replace('w4a16_', '') + ' us':>11}{'read/copy':>10}{'/peak':>7}"
    lines = [head + "".join(f"{label:>8}" for _, label in SPEEDUPS)]
    peak = result["matmul_peak_tflops"]
    for c in result["cases"]:
        line = f"{c['shape']:<8}{c['m']:>6}{c.get('w4a16_kernel', '-'):>7}"
        line += "".join(_cell(c, kind, peak) for kind in KINDS)
        lines.append(line + "".join(_speedup(c, kind, 8) for kind, _ in SPEEDUPS))
    return lines


def report(result: dict[str, Any]) -> None:
    if not result["cuda"]:
        print("no CUDA: tiny case under TRITON_INTERPRET=1; these figures mean nothing")
    print(
        f"same run: copy traffic {result['copy_traffic_gbps']:.0f} GB/s, "
        f"bf16 matmul peak {result['matmul_peak_tflops']:.0f} TFLOP/s"
    )
    print("\n".join(case_lines(result)))
    for name, cases in result["crossover"].items():
        for c in cases:
            w, f = c["w4a16"], c["fp8"]
            print(
                f"crossover {name} M {c['m']}: w4a16 tiled {w['fused_ms'] * 1e3:.1f} us, "
                f"dequant {w['dequant_ms'] * 1e3:.1f} us; fp8 fused {f['fused_ms'] * 1e3:.1f} "
                f"us, dequant {f['dequant_ms'] * 1e3:.1f} us"
            )
    for name, cases in result["sweep"].items():
        for c in cases:
            b, p = c["best"], c["plan"]
            print(
                f"sweep {name} M {c['m']} {c['kind']}: best {b['config']} {b['ms'] * 1e3:.1f} "
                f"us, plan {p['config']} {p['ms'] * 1e3:.1f} us"
            )
