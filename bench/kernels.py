"""Triton kernel speed against limits measured in the same run.

    python -m bench.kernels --batch 64 --ctx 2048 --out bench/results/kernels.json

Decode attention: bytes of K+V read for all contexts / kernel time, against the DRAM
traffic of a device-to-device ``copy_`` of the same number of bytes (a copy reads and writes
each byte, so its traffic is 2 x bytes / time); with ``--kv-cache-dtype int8`` (or fp8_e4m3) the
cache holds quantized rows (head_dim code bytes + 8 bytes of scales, engine.kv_format.rows) and the
bytes read are those rows. Prefill attention: FLOP/s against a same-run
square matmul. Kernels are timed inside a CUDA graph (the engine replays decode that way), so
Python launch cost is not counted. The layers of the cache are cycled so that L2 does not hold
the working set. Without CUDA it runs a tiny config under TRITON_INTERPRET=1 only to show that
the code path works: those figures are meaningless.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, environment, triton_device, write_json

LIMIT = 0.6  # acceptance: decode at >= 0.6 of the same-run copy traffic


@dataclass(frozen=True)
class Shape:
    """Attention shape of the benchmark (defaults: SmolLM2-135M, bf16, 16-token blocks)."""

    batch: int
    ctx: int
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    layers: int
    dtype: torch.dtype
    prefill_seqs: int
    prefill_new: int
    kv_cache_dtype: str = "auto"

    @property
    def row_bytes(self) -> int:
        """Bytes of one (token, KV head) row of K or V in the cache."""
        if self.kv_cache_dtype != "auto":
            from engine.kv_format.rows import row_width

            return row_width(self.head_dim, self.kv_cache_dtype)
        return self.head_dim * torch.empty((), dtype=self.dtype).element_size()


def time_ms(fn: Callable[[], object], iters: int, cuda: bool) -> float:
    """Milliseconds per call: CUDA-graph replay of ``iters`` calls, else wall clock once."""
    if not cuda:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    best = float("inf")
    for _ in range(5):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, begin.elapsed_time(end) / iters)
    return best


def make_cache(shape: Shape, lens: list[int], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Random cache [blocks, layers, 2, block, kv_heads, d] and shuffled block tables."""
    bs = shape.block_size
    per_seq = -(-max(lens) // bs)
    num_blocks = per_seq * len(lens)
    kv = torch.randn(
        (num_blocks, shape.layers, 2, bs, shape.kv_heads, shape.head_dim), device=device
    ).to(shape.dtype)
    if shape.kv_cache_dtype != "auto":
        from engine.kv_format.rows import quantize_rows

        kv = quantize_rows(kv, shape.kv_cache_dtype)
    tables = torch.randperm(num_blocks, device=device).view(len(lens), per_seq).to(torch.int32)
    ctx = torch.tensor(lens, dtype=torch.int32, device=device)
    return kv, tables, ctx


def bench_decode(shape: Shape, iters: int, device: torch.device) -> dict[str, Any]:
    from engine.triton_kernels import paged_decode_attention
    from engine.triton_kernels.decode_attention import plan_splits
    from engine.triton_kernels.reference import decode_attention_ref

    cuda = device.type == "cuda"
    kv, tables, ctx = make_cache(shape, [shape.ctx] * shape.batch, device)
    q = torch.randn(shape.batch, shape.heads, shape.head_dim, device=device).to(shape.dtype)
    scale = shape.head_dim**-0.5
    nbytes = shape.batch * shape.ctx * 2 * shape.kv_heads * shape.row_bytes
    auto = plan_splits(shape.batch, shape.kv_heads, tables.shape[1] * shape.block_size, 64, device)
    sweep: dict[int, float] = {}
    for splits in sorted({auto, 1, 2, 4, 8, 16} if cuda else {1, 2}):
        calls = itertools.count()

        def run(splits: int = splits, calls: Iterator[int] = calls) -> None:
            layer = next(calls) % shape.layers  # cycle layers: the working set exceeds L2
            paged_decode_attention(q, kv, layer, tables, ctx, scale, num_splits=splits)

        sweep[splits] = nbytes / (time_ms(run, iters, cuda) * 1e-3) / 1e9
    out = paged_decode_attention(q, kv, 0, tables, ctx, scale)
    ref_kv = kv
    if shape.kv_cache_dtype != "auto":  # the oracle reads the dequantized rows
        from engine.kv_format.rows import dequantize_rows

        ref_kv = dequantize_rows(kv, torch.float32).to(shape.dtype)
    ref = decode_attention_ref(q, ref_kv, 0, tables, ctx, scale)
    err = (out.float() - ref.float()).abs().max()
    return {
        "bytes": nbytes,
        "auto_splits": auto,
        "gbps": sweep[auto if cuda else 1],
        "gbps_by_splits": {str(k): v for k, v in sweep.items()},
        "max_abs_err_vs_reference": float(err),
    }


def bench_copy(nbytes: int, iters: int, device: torch.device) -> dict[str, float]:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), iters, device.type == "cuda")
    rate = nbytes / (ms * 1e-3) / 1e9
    return {"bytes": nbytes, "time_ms": ms, "copy_gbps": rate, "traffic_gbps": 2 * rate}


def bench_prefill(shape: Shape, iters: int, device: torch.device) -> dict[str, float]:
    from engine.triton_kernels import paged_prefill_attention

    cuda = device.type == "cuda"
    seqs, new, ctx_len = shape.prefill_seqs, shape.prefill_new, shape.ctx
    kv, tables, ctx = make_cache(shape, [ctx_len] * seqs, device)
    q = torch.randn(seqs * new, shape.heads, shape.head_dim, device=device).to(shape.dtype)
    cu_q = torch.arange(0, seqs * new + 1, new, dtype=torch.int32, device=device)
    scale = shape.head_dim**-0.5
    ms = time_ms(
        lambda: paged_prefill_attention(q, kv, 0, cu_q, ctx, tables, scale, max_q_len=new),
        iters,
        cuda,
    )
    pairs = seqs * (new * (ctx_len - new) + new * (new + 1) // 2)  # causal (query, key) pairs
    tflops = 4 * shape.heads * shape.head_dim * pairs / (ms * 1e-3) / 1e12
    n = 4096 if cuda else 64
    a = torch.randn(n, n, device=device).to(shape.dtype)
    mm_ms = time_ms(lambda: a @ a, max(iters // 10, 1), cuda)
    mm_tflops = 2 * n**3 / (mm_ms * 1e-3) / 1e12
    return {
        "time_ms": ms,
        "tflops": tflops,
        "matmul_tflops": mm_tflops,
        "ratio": tflops / mm_tflops,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4, help="cache layers, cycled between calls")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument(
        "--kv-cache-dtype", choices=["auto", "int8", "fp8_e4m3"], default="auto",
        help="rows of the cache: the model dtype, or quantized rows (engine.kv_format.rows)",
    )  # fmt: skip
    ap.add_argument("--prefill-seqs", type=int, default=4)
    ap.add_argument("--prefill-new", type=int, default=512, help="new tokens per sequence")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "kernels.json")
    return ap.parse_args(argv)


def shape_from(args: argparse.Namespace, cuda: bool) -> Shape:
    if args.prefill_new > args.ctx:
        raise ValueError(f"--prefill-new ({args.prefill_new}) must be <= --ctx ({args.ctx})")
    if not cuda:  # the interpreter runs each program in Python: keep it tiny
        return Shape(2, 40, 4, 2, 16, 4, 2, torch.float32, 2, 8, args.kv_cache_dtype)
    return Shape(
        args.batch, args.ctx, args.heads, args.kv_heads, args.head_dim, args.block_size,
        args.layers, getattr(torch, args.dtype), args.prefill_seqs, args.prefill_new,
        args.kv_cache_dtype,
    )  # fmt: skip


def report(result: dict[str, Any]) -> None:
    d, c, p = result["decode"], result["copy"], result["prefill"]
    if not result["cuda"]:
        print("no CUDA: tiny config under TRITON_INTERPRET=1; these figures mean nothing")
    print(f"{'what':<34}{'value':>14}")
    print(f"{'KV cache dtype':<34}{result['shape']['kv_cache_dtype']:>14}")
    print(f"{'decode bytes read (K+V)':<34}{d['bytes']:>14,}")
    for splits, gbps in d["gbps_by_splits"].items():
        print(f"{'decode GB/s, splits=' + splits:<34}{gbps:>14.1f}")
    print(f"{'copy traffic GB/s (read+write)':<34}{c['traffic_gbps']:>14.1f}")
    print(f"{'decode / copy traffic':<34}{result['ratio']:>14.3f}  (limit {LIMIT})")
    print(f"{'decode max |err| vs reference':<34}{d['max_abs_err_vs_reference']:>14.2e}")
    print(f"{'prefill ms':<34}{p['time_ms']:>14.3f}")
    print(f"{'prefill TFLOP/s / matmul':<34}{p['tflops']:>8.1f} /{p['matmul_tflops']:>5.1f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = triton_device()
    cuda = device.type == "cuda"
    shape = shape_from(args, cuda)
    iters = args.iters if cuda else 1
    decode = bench_decode(shape, iters, device)
    copy = bench_copy(decode["bytes"], iters, device)
    result = {
        "cuda": cuda,
        "meaningful": cuda,
        "environment": environment(),
        "shape": {**asdict(shape), "dtype": str(shape.dtype)},
        "decode": decode,
        "copy": copy,
        "ratio": decode["gbps"] / copy["traffic_gbps"],
        "limit": LIMIT,
        "prefill": bench_prefill(shape, iters, device),
    }
    result["meets_limit"] = cuda and result["ratio"] >= LIMIT
    report(result)
    print(f"wrote {write_json(args.out, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
