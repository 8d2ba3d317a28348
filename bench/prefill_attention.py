"""Prefill attention (Triton) against a same-run bf16 matmul of equal FLOPs: issue 30's figure.

    python -m bench.prefill_attention [--seqs 4 --new 2048] [--out PATH]

The kernel runs ``--seqs`` sequences of ``--new`` new tokens each (after ``--prefix`` cached
ones) over the paged cache, timed inside a CUDA graph (``bench.kernels.time_ms``). Its FLOPs
are those of the (query, key) pairs the mask lets through, 4 x heads x head_dim per pair (QK^T
and PV). The limit is a square matmul of the same dtype doing as many FLOPs, timed the same
way in the same run; a large square matmul (the device's peak) is reported beside it. The
acceptance figure is ``ratio``: kernel TFLOP/s / equal-FLOPs matmul TFLOP/s (>= 0.5 at
4 x 2048 tokens, bf16). Without CUDA it says so and exits 0: the interpreter times nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, environment, write_json

LIMIT = 0.5  # acceptance: >= 0.5 of the same-run bf16 matmul of equal FLOPs


def attended_pairs(new: int, prefix: int, window: int) -> int:
    """(query, key) pairs one sequence computes: causal, within ``window`` when > 0."""
    total = 0
    for p in range(prefix, prefix + new):
        total += p + 1 if window <= 0 else min(p + 1, window)
    return total


def equal_flops_side(flops: float, multiple: int = 128) -> int:
    """Side n of the square matmul (2 n^3 FLOPs) closest to ``flops``, a multiple of 128."""
    return max(multiple, round((flops / 2) ** (1 / 3) / multiple) * multiple)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--new", type=int, default=2048, help="new tokens per sequence")
    ap.add_argument("--prefix", type=int, default=0, help="cached tokens before them")
    ap.add_argument("--window", type=int, default=0, help="sliding window, 0: full causal")
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "prefill_attention.json")
    return ap.parse_args(argv)


def measure(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Times the kernel and both matmuls on ``device``: CUDA, or the CPU under the
    interpreter for tests of this code (one wall-clock call each, a small peak matmul)."""
    from bench.kernels import Shape, make_cache, time_ms
    from engine.triton_kernels import paged_prefill_attention
    from engine.triton_kernels.reference import prefill_attention_ref

    dtype, cuda = getattr(torch, args.dtype), device.type == "cuda"
    ctx_len = args.prefix + args.new
    shape = Shape(
        args.seqs, ctx_len, args.heads, args.kv_heads, args.head_dim, args.block_size, 1,
        dtype, args.seqs, args.new,
    )  # fmt: skip
    kv, tables, ctx = make_cache(shape, [ctx_len] * args.seqs, device)
    q = torch.randn(args.seqs * args.new, args.heads, args.head_dim, device=device).to(dtype)
    cu_q = torch.arange(0, args.seqs * args.new + 1, args.new, dtype=torch.int32, device=device)
    call = (q, kv, 0, cu_q, ctx, tables, args.head_dim**-0.5)
    ms = time_ms(
        lambda: paged_prefill_attention(*call, max_q_len=args.new, window=args.window),
        args.iters,
        cuda,
    )
    flops = (
        4
        * args.heads
        * args.head_dim
        * args.seqs
        * attended_pairs(args.new, args.prefix, args.window)
    )
    out = paged_prefill_attention(*call, max_q_len=args.new, window=args.window)
    first = slice(0, args.new)  # one sequence is enough to catch a wrong kernel
    ref = prefill_attention_ref(
        q[first], kv, 0, cu_q[:2], ctx[:1], tables[:1], args.head_dim**-0.5, args.window
    )
    n = equal_flops_side(flops)
    a = torch.randn(n, n, device=device).to(dtype)
    mm_ms = time_ms(lambda: a @ a, args.iters, cuda)
    peak_n = 8192 if cuda else 128
    big = torch.randn(peak_n, peak_n, device=device).to(dtype)
    peak_ms = time_ms(lambda: big @ big, max(args.iters // 4, 1), cuda)
    tflops = flops / (ms * 1e-3) / 1e12
    mm_tflops = 2 * n**3 / (mm_ms * 1e-3) / 1e12
    return {
        "time_ms": ms,
        "flops": flops,
        "tflops": tflops,
        "matmul_side": n,
        "matmul_tflops": mm_tflops,
        "peak_matmul_side": peak_n,
        "peak_matmul_tflops": 2 * peak_n**3 / (peak_ms * 1e-3) / 1e12,
        "ratio": tflops / mm_tflops,
        "max_abs_err_vs_reference": float((out[first].float() - ref.float()).abs().max()),
    }


def report(args: argparse.Namespace, f: dict[str, Any]) -> None:
    print(f"prefill attention {args.seqs} x {args.new} (+{args.prefix} cached), {args.dtype}")
    print(f"{'kernel ms':<34}{f['time_ms']:>12.3f}")
    print(f"{'kernel TFLOP/s':<34}{f['tflops']:>12.1f}")
    equal = f"matmul TFLOP/s, n={f['matmul_side']} (equal)"
    print(f"{equal:<34}{f['matmul_tflops']:>12.1f}")
    peak = f"matmul TFLOP/s, n={f['peak_matmul_side']} (peak)"
    print(f"{peak:<34}{f['peak_matmul_tflops']:>12.1f}")
    print(f"{'kernel / equal-FLOPs matmul':<34}{f['ratio']:>12.3f}  (limit {LIMIT})")
    print(f"{'max |err| vs reference (seq 0)':<34}{f['max_abs_err_vs_reference']:>12.2e}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA here: the prefill attention figure needs a GPU; nothing measured")
        return 0
    figures = measure(args, torch.device("cuda"))
    result = {
        "environment": environment(),
        "args": {k: str(v) for k, v in vars(args).items()},
        **figures,
        "limit": LIMIT,
        "meets_limit": figures["ratio"] >= LIMIT,
    }
    report(args, figures)
    print(f"wrote {write_json(args.out, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
