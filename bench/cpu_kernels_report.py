"""bench.cpu_kernels' printed report: one block of lines per part of its result."""

from __future__ import annotations

from typing import Any

import torch


def print_attention(attention: dict[str, Any]) -> None:
    print(f"decode attention, memcpy {attention['memcpy_gb_s']:.1f} GB/s:")
    for name in ("torch_gather_sdpa", "c_kernel"):
        if name in attention:
            r = attention[name]
            print(
                f"  {name:>18}: {r['ms_per_layer']:6.2f} ms/layer  {r['kv_gb_s']:5.1f} GB/s "
                f"of K+V  ratio to memcpy {r['ratio_to_memcpy']:.2f}"
            )


def print_linear(linear: dict[str, Any], rows: list[int]) -> None:
    print(f"decoder linear layers, matmul peak {linear['matmul_peak_gflop_s']:.1f} GFLOP/s:")
    print_rows(linear, rows)


def print_rows(result: dict[str, Any], rows: list[int]) -> None:
    for n in rows:
        r = result[f"rows_{n}"]
        cells = [f"{k.removesuffix('_gflop_s')} {v:6.1f}" for k, v in r.items() if "gflop" in k]
        ratios = [f"{v:.2f}" for k, v in r.items() if "ratio" in k]
        print(f"  {n:>4} rows: GFLOP/s {'  '.join(cells)}  (ratio {' / '.join(ratios)})")


def print_packed(packed: dict[str, Any], rows: list[int]) -> None:
    print(
        f"decoder linear layers packed as Q4_1 (AMX: {packed['amx']}; integer kernel: "
        f"{packed.get('int8_kernel', '?')}), fp32 / bf16 matmul "
        f"peak {packed['fp32_matmul_peak_gflop_s']:.1f} / "
        f"{packed['bf16_matmul_peak_gflop_s']:.1f} GFLOP/s, fp32 per CPU-second "
        f"{packed['fp32_matmul_peak_cpu_gflop_s']:.1f}; each path: GFLOP/s, its ratio to the "
        "fp32 and bf16 peaks, and per CPU-second to the fp32 peak's:"
    )
    for n in rows:
        r = packed[f"rows_{n}"]
        names = [k.removesuffix("_cpu_gflop_s") for k in r if k.endswith("_cpu_gflop_s")]
        cells = [
            f"{m} {r[m + '_gflop_s']:.1f} ({r[m + '_ratio_to_fp32_peak']:.2f} / "
            f"{r[m + '_ratio_to_bf16_peak']:.2f} / {r[m + '_cpu_ratio_to_fp32_peak']:.2f})"
            for m in names
        ]
        print(f"  {n:>4} rows: {'  '.join(cells)}")
    for k, b in packed["prefill_blocking"].items():
        print(f"  prefill blocks, {k}: " + ", ".join(f"{name} {v}" for name, v in b.items()))


def print_prefill(prefill: dict[str, Any], lens: list[int]) -> None:
    print(f"prefill attention, one fresh prompt, fp32, {torch.get_num_threads()} threads:")
    for n in lens:
        r = prefill[f"tokens_{n}"]
        cells = [
            f"{k.removesuffix('_ms')} {v:7.3f} ms ({r[k[:-3] + '_ratio_to_matmul']:.2f})"
            for k, v in r.items()
            if k.endswith("_ms") and not k.endswith("_cpu_ms")
        ]
        print(f"  {n:>5}: {'  '.join(cells)}  C / torch {r['speedup_c_over_torch']:.2f}x")
        cpu = r["speedup_c_over_torch_cpu_time"]
        print(f"  {'':>5}  CPU time per call: C / torch {cpu:.2f}x")
