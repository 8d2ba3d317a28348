"""CPU kernels against limits measured in the same run.

    python -m bench.cpu_kernels [--seqs 32] [--min-ctx 64] [--max-ctx 640] [--out PATH]

Decode attention (fp32, SmolLM2-135M heads by default): the C kernel of engine.cpu_kernels
and the torch path it replaces (gather the blocks, padded SDPA), as bytes of K+V read per
second against the same run's memcpy bandwidth (``bench.common.memcpy_gbps``). The cache
has as many layers as the model and they are cycled, so the working set does not stay in
the CPU caches. The model's linear layers from 1 to 512 rows: F.linear and the C kernel
over packed weights (engine.model.linear), as GFLOP/s against the same run's matmul peak.
The same layers packed as Q4_1 (4-bit codes, scale and min per 32 inputs, random), from 1
to 1024 rows: the packed kernel (engine.cpu_kernels.quant_linear: AMX tiles where the machine
has them, ``packed_fma`` its FMA path, ``packed_int8`` the integer-dot kernel of
engine.cpu_kernels.quant_int8 where the build has one), the fp32 kernel, and F.linear in bf16
(oneDNN, AMX bf16 where present: what vLLM's CPU backend runs), against the same run's fp32
and bf16 matmul peaks (each the better of before and after).
Prefill attention (fp32, one fresh prompt of each ``--prefill-lens``, causal): the C prefill
kernel (engine.cpu_kernels.prefill) and the torch path it replaces (one SDPA call per chunk,
``attend``), interleaved, against a same-run fp32 matmul of equal FLOPs (4 x heads x d per
attended (query, key) pair); the cache has an int8 twin, timed too. Best wall time and best
process CPU time per call of the rounds (CPU time moves less on a machine shared with other
work; with several threads it counts them all).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from bench.common import RESULTS_DIR, environment, matmul_peak_gflops, memcpy_gbps, write_json
from bench.cpu_kernels_report import print_attention, print_linear, print_packed, print_prefill


def best_seconds(fn: Callable[[int], object], calls: int, repeats: int = 5) -> float:
    """Best over ``repeats`` of the mean time of ``calls`` calls fn(0), fn(1), ..."""
    fn(0)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def best_wall_and_cpu(fn: Callable[[int], object], repeats: int) -> tuple[float, float]:
    """Best wall time and best process CPU time of one call fn(0) over ``repeats``."""
    fn(0)
    wall = cpu = float("inf")
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn(0)
        cpu = min(cpu, time.process_time() - start_cpu)
        wall = min(wall, time.perf_counter() - start)
    return wall, cpu


def bench_attention(args: argparse.Namespace) -> dict[str, Any]:
    from engine import cpu_kernels
    from engine.model.torch_attention import GatherBuffers, decode_attention

    gen = torch.Generator().manual_seed(0)
    bs, width = args.block_size, -(-args.max_ctx // args.block_size)
    lens = torch.randint(args.min_ctx, args.max_ctx + 1, (args.seqs,), generator=gen)
    lens = lens.to(torch.int32)
    # each sequence owns a run of blocks, as the block manager hands them out
    tables = (torch.arange(args.seqs * width).view(args.seqs, width) + 1).to(torch.int32)
    kv = torch.randn(
        args.seqs * width + 1, args.layers, 2, bs, args.kv_heads, args.head_dim, generator=gen
    )
    q = torch.randn(args.seqs, args.heads, args.head_dim, generator=gen)
    mask = (torch.arange(width * bs)[None, :] < lens[:, None])[:, None, None, :]
    buffers = GatherBuffers()
    scale = args.head_dim**-0.5
    kv_bytes = int(lens.sum()) * 2 * args.kv_heads * args.head_dim * 4
    runs: dict[str, Callable[[int], object]] = {
        "torch_gather_sdpa": lambda i: decode_attention(
            q, kv, i % args.layers, tables, mask, buffers
        ),
    }
    if cpu_kernels.supports(q, kv):
        runs["c_kernel"] = lambda i: cpu_kernels.paged_decode_attention(
            q, kv, i % args.layers, tables, lens, scale
        )
    else:
        print("C kernels unavailable here: only the torch path is measured", file=sys.stderr)
    copy = memcpy_gbps(kv_bytes)
    out: dict[str, Any] = {"kv_bytes_per_call": kv_bytes, "memcpy_gb_s": copy}
    for name, fn in tqdm(runs.items(), desc="attention", file=sys.stderr):
        secs = best_seconds(fn, args.layers)
        gbps = kv_bytes / secs / 1e9
        out[name] = {"ms_per_layer": secs * 1e3, "kv_gb_s": gbps, "ratio_to_memcpy": gbps / copy}
    return out


def bench_linear(args: argparse.Namespace) -> dict[str, Any]:
    from engine.model import linear as cpu_linear

    peak = matmul_peak_gflops(torch.float32)
    shapes = {  # SmolLM2-135M's decoder weights [out, in]
        "qkv": (960, 576),
        "o_proj": (576, 576),
        "gate_up": (3072, 576),
        "down": (576, 1536),
    }
    weights = {n: [torch.randn(s) for _ in range(args.layers)] for n, s in shapes.items()}
    out: dict[str, Any] = {"matmul_peak_gflop_s": peak}
    packed = {n: [cpu_linear.pack(w) for w in ws] for n, ws in weights.items()}
    kernel = all(p is not None for ps in packed.values() for p in ps)
    if not kernel:
        print("C kernels unavailable here: only F.linear is measured", file=sys.stderr)
    for rows in tqdm(args.rows, desc="linear", file=sys.stderr):
        x = {n: torch.randn(rows, s[1]) for n, s in shapes.items()}
        flops = 2 * rows * args.layers * sum(o * i for o, i in shapes.values())

        def plain(_: int, x: dict[str, torch.Tensor] = x) -> None:
            for n, ws in weights.items():
                for w in ws:
                    F.linear(x[n], w)

        def from_packed(_: int, x: dict[str, torch.Tensor] = x) -> None:
            for n, ws in weights.items():
                for w, p in zip(ws, packed[n], strict=True):
                    cpu_linear.linear(x[n], w, p)

        row: dict[str, float] = {}
        runs = {"f_linear": plain, "c_kernel": from_packed} if kernel else {"f_linear": plain}
        for name, fn in runs.items():
            secs = best_seconds(fn, 1, repeats=3)
            row[f"{name}_gflop_s"] = flops / secs / 1e9
            row[f"{name}_ratio_to_peak"] = flops / secs / 1e9 / peak
        out[f"rows_{rows}"] = row
    return out


Layer = tuple[Any, torch.Tensor, torch.Tensor, int]  # QuantWeight, fp32 panels, bf16, in


def packed_runs(
    layers: list[Layer], x: dict[int, torch.Tensor], xb: dict[int, torch.Tensor]
) -> dict[str, Callable[[int], object]]:
    """One call of each path over every layer, x and xb by input width."""
    from engine import cpu_kernels
    from engine.cpu_kernels.quant_int8 import QuantInt8Linear, amx_int8, isa, without_amx
    from engine.cpu_kernels.quant_linear import quant_linear

    int8 = [(QuantInt8Linear(q._cpu_kernel), k) for q, _p, _b, k in layers] if isa() else []
    vnni = {}
    if int8 and amx_int8():  # the AMX-int8 kernel against the VNNI one it replaces

        def vnni_run(_: int) -> object:
            with without_amx():
                return [q(x[k]) for q, k in int8]

        vnni = {"packed_int8_vnni": vnni_run}
    return {
        "packed": lambda _: [q.linear(x[k]) for q, _p, _b, k in layers],
        **({"packed_int8": lambda _: [q(x[k]) for q, k in int8]} if int8 else {}),
        **vnni,
        "packed_fma": lambda _: [
            quant_linear(x[k], q.codes, q.scales, q.mins, 4, 32, amx_rows=0)
            for q, _p, _b, k in layers
        ],
        "fp32_kernel": lambda _: [cpu_kernels.linear(x[k], p) for _q, p, _b, k in layers],
        "torch_bf16": lambda _: [F.linear(xb[k], b) for _q, _p, b, k in layers],
    }


def bench_packed_linear(args: argparse.Namespace) -> dict[str, Any]:
    from engine import cpu_kernels
    from engine.cpu_kernels.quant_int8 import kernel_name
    from engine.cpu_kernels.quant_linear import amx_available, prefill_blocking
    from engine.model.quant.weight import QuantWeight, RowQuant

    if not cpu_kernels.available():
        print("C kernels unavailable here: packed linear skipped", file=sys.stderr)
        return {}
    peak, fp32_peak = matmul_peak_gflops(torch.bfloat16), matmul_peak_gflops(torch.float32)
    cpu_peak = matmul_peak_gflops(torch.float32, clock=time.process_time)
    gen = torch.Generator().manual_seed(1)
    shapes = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
    layers: list[Layer] = []
    for _ in range(args.layers):
        for n, k in shapes.values():
            codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
            scales = (torch.rand(n, k // 32, generator=gen) * 0.01).half().float()
            mins = (-8 * scales).half().float()
            q = QuantWeight(RowQuant(codes, scales, mins, 4, 32))
            dense = q.dequantize()
            panels = cpu_kernels.pack_linear_weight(dense)
            assert panels is not None  # N is a multiple of 16
            layers.append((q, panels, dense.bfloat16(), k))
    widths = sorted({s[1] for s in shapes.values()})
    out: dict[str, Any] = {
        "amx": amx_available(),
        "int8_kernel": kernel_name(),
        "prefill_blocking": {f"k_{k}": prefill_blocking(k)._asdict() for k in widths},
    }
    for rows in tqdm(args.packed_rows, desc="packed linear", file=sys.stderr):
        x = {k: torch.randn(rows, k) for k in widths}
        flops = 2 * rows * args.layers * sum(o * i for o, i in shapes.values())
        runs = packed_runs(layers, x, {k: v.bfloat16() for k, v in x.items()})
        row: dict[str, float] = {}
        for name, fn in runs.items():
            wall, cpu = best_wall_and_cpu(fn, repeats=3)
            row[f"{name}_gflop_s"], row[f"{name}_cpu_gflop_s"] = (
                flops / wall / 1e9,
                flops / cpu / 1e9,
            )
        out[f"rows_{rows}"] = row
    # the peaks before and after, the better kept: one taken while other work loads the
    # machine would flatter the ratios
    peak = max(peak, matmul_peak_gflops(torch.bfloat16))
    fp32_peak = max(fp32_peak, matmul_peak_gflops(torch.float32))
    cpu_peak = max(cpu_peak, matmul_peak_gflops(torch.float32, clock=time.process_time))
    out |= {"bf16_matmul_peak_gflop_s": peak, "fp32_matmul_peak_gflop_s": fp32_peak,
            "fp32_matmul_peak_cpu_gflop_s": cpu_peak}  # fmt: skip
    for rows in args.packed_rows:
        row = out[f"rows_{rows}"]
        for name in [k.removesuffix("_cpu_gflop_s") for k in row if k.endswith("_cpu_gflop_s")]:
            row[f"{name}_ratio_to_fp32_peak"] = row[f"{name}_gflop_s"] / fp32_peak
            row[f"{name}_ratio_to_bf16_peak"] = row[f"{name}_gflop_s"] / peak
            row[f"{name}_cpu_ratio_to_fp32_peak"] = row[f"{name}_cpu_gflop_s"] / cpu_peak
    return out


def bench_prefill(args: argparse.Namespace) -> dict[str, Any]:
    from engine import cpu_kernels

    if not cpu_kernels.available():
        print("C kernels unavailable here: prefill attention skipped", file=sys.stderr)
        return {}
    gen = torch.Generator().manual_seed(2)
    lens = tqdm(args.prefill_lens, desc="prefill attention", file=sys.stderr)
    return {f"tokens_{n}": prefill_row(args, n, gen) for n in lens}


def prefill_row(args: argparse.Namespace, n: int, gen: torch.Generator) -> dict[str, float]:
    """One prompt of n tokens: the torch path, the C kernel over an fp32 and an int8 cache
    (one cached token, so that it reads the cache) and the equal-FLOPs matmul, interleaved."""
    from bench.prefill_attention import attended_pairs, equal_flops_side
    from engine import cpu_kernels
    from engine.kv_format.rows import quantize_rows
    from engine.model.attention import AttentionMetadata
    from engine.model.torch_attention import attend

    h, kvh, d, bs, scale = args.heads, args.kv_heads, args.head_dim, args.block_size, 0.125
    blocks = -(-n // bs)
    kv = torch.randn(blocks + 1, 1, 2, bs, kvh, d, generator=gen)
    kv8 = quantize_rows(kv, "int8").view(torch.int8)
    table = [list(range(1, blocks + 1))]
    q = torch.randn(n, h, d, generator=gen)
    k, v = torch.randn(n, kvh, d, generator=gen), torch.randn(n, kvh, d, generator=gen)
    flops = 4 * h * d * attended_pairs(n, 0, 0)
    side = equal_flops_side(flops, 16)
    a = torch.randn(side, side, generator=gen)

    def kernel(cached: int, cache: torch.Tensor) -> Callable[[int], object]:
        m = AttentionMetadata.build([n - cached], [cached], table, bs)
        qs, ks, vs = q[cached:], k[cached:], v[cached:]
        return lambda _: cpu_kernels.paged_prefill_attention(
            qs, ks, vs, cache, 0, m.query_start_loc, m.context_lens, m.block_tables, scale
        )

    runs: dict[str, Callable[[int], object]] = {
        "torch_sdpa": lambda _: attend(q, k, v, None, scale),
        "c_kernel": kernel(0, kv),
        "c_kernel_int8_cache": kernel(1, kv8),
        "equal_flops_matmul": lambda _: a @ a,
    }
    best = dict.fromkeys(runs, float("inf"))
    cpu = dict.fromkeys(runs, float("inf"))
    for _ in range(args.prefill_repeats):  # interleaved: a loaded machine hits all alike
        for name, fn in runs.items():
            fn(0)
            wall, start = time.perf_counter(), time.process_time()
            for i in range(3):
                fn(i)
            cpu[name] = min(cpu[name], (time.process_time() - start) / 3)
            best[name] = min(best[name], (time.perf_counter() - wall) / 3)
    row = {"flops": float(flops), "matmul_side": float(side)}
    mm = 2 * side**3 / best["equal_flops_matmul"] / 1e9
    for name, secs in best.items():
        gflops = (2 * side**3 if name == "equal_flops_matmul" else flops) / secs / 1e9
        row[f"{name}_ms"], row[f"{name}_gflop_s"] = secs * 1e3, gflops
        row[f"{name}_ratio_to_matmul"] = gflops / mm
        row[f"{name}_cpu_ms"] = cpu[name] * 1e3
    row["speedup_c_over_torch"] = best["torch_sdpa"] / best["c_kernel"]
    row["speedup_c_over_torch_cpu_time"] = cpu["torch_sdpa"] / cpu["c_kernel"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--min-ctx", type=int, default=64)
    ap.add_argument("--max-ctx", type=int, default=640)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--layers", type=int, default=30, help="cache layers, cycled between calls")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 24, 32, 64, 256, 512])
    ap.add_argument("--packed-rows", type=int, nargs="+", default=[1, 32, 256, 1024])
    ap.add_argument("--prefill-lens", type=int, nargs="+", default=[384, 1024, 2048])
    ap.add_argument("--prefill-repeats", type=int, default=10, help="interleaved rounds")
    ap.add_argument("--only", choices=["attention", "linear", "packed", "prefill"], nargs="+")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "cpu_kernels.json")
    args = ap.parse_args(argv)
    for name in ("seqs", "min_ctx", "max_ctx", "layers", "block_size"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.min_ctx > args.max_ctx:
        ap.error(f"--min-ctx {args.min_ctx} is above --max-ctx {args.max_ctx}")

    only = set(args.only or ["attention", "linear", "packed", "prefill"])
    payload: dict[str, Any] = {
        "benchmark": "cpu_kernels",
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "environment": environment(),
    }
    if "attention" in only:
        payload["attention"] = attention = bench_attention(args)
        print_attention(attention)
    if "linear" in only:
        payload["linear"] = linear = bench_linear(args)
        print_linear(linear, args.rows)
    if "packed" in only and (packed := bench_packed_linear(args)):
        payload["packed_linear"] = packed
        print_packed(packed, args.packed_rows)
    if "prefill" in only and (prefill := bench_prefill(args)):
        payload["prefill_attention"] = prefill
        print_prefill(prefill, args.prefill_lens)
    write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
