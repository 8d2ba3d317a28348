"""A mixture-of-experts layer on the CPU: the C kernel against the torch path.

    python -m bench.moe [--hidden 1024] [--inter 384] [--experts 128] [--top-k 8]
                        [--tokens 1 16 64] [--out PATH]

The layer is Qwen3-30B-A3B's MoE block (hidden 2048, 128 experts of width 768, top-8) with
hidden and expert width halved by default, so its fp32 experts (604 MB, and as much again
packed for the C kernel) fit beside other work; the routing (8 of 128) is the real one.
Each token count is timed on both paths (engine.model.moe.SparseMoe, random weights, router
logits spread over a few units), the calls cycling through batches so that the experts read
change as between layers; the fastest call counts (the median is written too: on a shared
machine the slow calls are the ones another process interrupted). Limits measured in the same run:
- compute: the FLOPs of the active parameters (top-k experts and the router, per token)
  against a dense ``F.linear`` of the same active-parameter size on the same tokens, and
  against the square-matmul peak (``bench.common.matmul_peak_gflops``);
- memory: the bytes of the experts the step's tokens chose (each read once) against the
  copy bandwidth (``bench.common.memcpy_gbps``); decode steps are bound by it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench.common import RESULTS_DIR, environment, matmul_peak_gflops, memcpy_gbps, write_json
from engine.model.moe import SparseMoe, expert_weight_bytes, route


def call_seconds(fn: Callable[[int], object], calls: int) -> list[float]:
    """Seconds of each of fn(0) .. fn(calls - 1), after one warm-up call. On a shared machine
    the fastest calls are the ones no other process interrupted."""
    fn(0)
    out = []
    for i in range(calls):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def make_layer(args: argparse.Namespace) -> SparseMoe:
    block = SparseMoe(
        args.hidden, args.inter, args.experts, args.top_k, normalize=True, activation="silu",
        dtype=torch.float32, device="cpu",
    )  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in block.named_parameters():
            scale = 3.0 if name == "gate" else 1.0
            p.copy_(torch.randn(p.shape, generator=gen) * scale / p.shape[-1] ** 0.5)
    block.pack_cpu_weights()
    return block


def bench_tokens(block: SparseMoe, tokens: int, args: argparse.Namespace) -> dict[str, Any]:
    h, i, k, e = args.hidden, args.inter, args.top_k, args.experts
    # a new batch per call, so the experts read change and do not stay in the CPU caches
    gen = torch.Generator().manual_seed(tokens)
    xs = [torch.randn(tokens, h, generator=gen) for _ in range(args.batches)]
    active_params = k * 3 * i * h + e * h
    flops = 2 * tokens * active_params
    hit = sum(route(F.linear(x, block.gate), k, True).ids.unique().numel() for x in xs)
    hit /= len(xs)
    read_bytes = (hit * 3 * i * h + e * h) * 4
    dense = torch.randn(active_params // h, h)
    row: dict[str, Any] = {"experts_hit": hit, "expert_bytes_read": read_bytes}
    runs = {
        "dense_linear": lambda n: F.linear(xs[n % len(xs)], dense),
        "torch": lambda n: block(xs[n % len(xs)], "torch"),
    }
    if block.packed_experts is not None:
        runs["c_kernel"] = lambda n: block(xs[n % len(xs)], "c")
    for name, fn in runs.items():
        times = call_seconds(fn, args.calls)
        secs = min(times)
        gflops, gbps = flops / secs / 1e9, read_bytes / secs / 1e9
        row[name] = {
            "ms": secs * 1e3,
            "median_ms": statistics.median(times) * 1e3,
            "gflop_s": gflops,
            "gb_s": gbps,
        }
    dense_gflops = row["dense_linear"]["gflop_s"]
    for name in runs.keys() - {"dense_linear"}:
        r = row[name]
        r["ratio_to_dense"] = r["gflop_s"] / dense_gflops
        r["ratio_to_peak"] = r["gflop_s"] / args.peak
        r["ratio_to_memcpy"] = r["gb_s"] / args.memcpy
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--inter", type=int, default=384, help="each expert's intermediate size")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--calls", type=int, default=16, help="timed calls per path; the best counts")
    ap.add_argument("--batches", type=int, default=8, help="different batches, cycled")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "moe.json")
    args = ap.parse_args(argv)
    for name in ("hidden", "inter", "experts", "top_k", "calls", "batches"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.top_k > args.experts:
        ap.error(f"--top-k {args.top_k} is above --experts {args.experts}")

    block = make_layer(args)
    if block.packed_experts is None:
        print("C kernels unavailable here: only the torch path is measured", file=sys.stderr)
    args.peak = matmul_peak_gflops(torch.float32)
    args.memcpy = memcpy_gbps(min(max(expert_weight_bytes(block), 16 << 20), 256 << 20))
    print(
        f"MoE layer H={args.hidden} I={args.inter} E={args.experts} top-{args.top_k}, fp32, "
        f"{torch.get_num_threads()} threads; matmul peak {args.peak:.1f} GFLOP/s, memcpy "
        f"{args.memcpy:.1f} GB/s"
    )
    results: dict[str, Any] = {}
    for tokens in args.tokens:
        row = results[f"tokens_{tokens}"] = bench_tokens(block, tokens, args)
        print(
            f"  {tokens:>4} tokens ({row['experts_hit']:.0f} experts hit, dense same-size linear "
            f"{row['dense_linear']['gflop_s']:.1f} GFLOP/s):"
        )
        for name in ("torch", "c_kernel"):
            if name in row:
                r = row[name]
                print(
                    f"    {name:>8}: {r['ms']:7.2f} ms (median {r['median_ms']:7.2f})  "
                    f"{r['gflop_s']:6.1f} GFLOP/s active  "
                    f"ratio to dense {r['ratio_to_dense']:.2f}, to peak {r['ratio_to_peak']:.2f}"
                    f"  {r['gb_s']:5.1f} GB/s of experts, ratio to memcpy "
                    f"{r['ratio_to_memcpy']:.2f}"
                )
    write_json(
        args.out,
        {
            "benchmark": "moe",
            "args": {k: v for k, v in vars(args).items() if k not in ("out", "peak", "memcpy")},
            "environment": environment(),
            "matmul_peak_gflop_s": args.peak,
            "memcpy_gb_s": args.memcpy,
            "results": results,
        },
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
