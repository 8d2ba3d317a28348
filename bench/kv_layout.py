"""Block-major against layer-major KV cache for the CPU decode attention path.

    python -m bench.kv_layout [--seqs 32 --context 512] [--out bench/results/kv_layout.json]

One decode attention step = for every layer, gather each sequence's K and V blocks through a
scattered block table, then one batched SDPA call. Block-major is the engine's layout
``[blocks, layers, 2, block_size, kv_heads, head_dim]``; layer-major is ``[layers, 2, blocks,
block_size, kv_heads, head_dim]``. Both run the engine's own ``decode_attention`` (the
layer-major tensor is seen through a view indexed like the block-major one: only the memory
order differs). Both are compared to a same-run memcpy of the bytes one step gathers, and the
gathers alone are timed too (the only part the layout changes).

The machine may be shared, so time is this thread's CPU time by default (blind to
preemption), each sample is one layer (layers cycled so caches stay cold), variants
interleaved; a step is the fastest layer sample times the layer count (medians are in the
JSON too). Single-threaded by default. Shapes default to SmolLM2-135M.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, environment, write_json
from engine.model.torch_attention import GatherBuffers, decode_attention, gather_blocks

KEEP_BLOCK_MAJOR_UNLESS = 1.2  # switch only if layer-major is this much faster


def sample_layers(
    variants: dict[str, Callable[[int], object]],
    layers: int,
    samples: int,
    clock: Callable[[], float],
) -> dict[str, list[float]]:
    """Milliseconds of single-layer calls, variants interleaved, layers cycled (cold caches)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():
        fn(0)  # warm-up: allocator
    for i in range(samples):
        for name, fn in variants.items():
            start = clock()
            fn(i % layers)
            times[name].append((clock() - start) * 1e3)
    return times


def step_ms(times: list[float], layers: int) -> dict[str, float]:
    """A whole step (all layers) from per-layer samples: best case and typical case."""
    return {"best": min(times) * layers, "median": statistics.median(times) * layers}


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    layers, bs, kvh, d = args.layers, args.block_size, args.kv_heads, args.head_dim
    per_seq = -(-args.context // bs)
    num_blocks = args.seqs * per_seq + 8
    block_major = torch.randn(num_blocks, layers, 2, bs, kvh, d, dtype=dtype)
    # the same data stored layer-major, seen through a view indexed like the block-major cache
    layer_major = block_major.permute(1, 2, 0, 3, 4, 5).contiguous().permute(2, 0, 1, 3, 4, 5)
    tables = torch.randperm(num_blocks)[: args.seqs * per_seq].view(args.seqs, per_seq)
    tables = tables.to(torch.int32)  # scattered blocks, as after some churn
    flat = tables.flatten()
    lens = torch.full((args.seqs,), args.context)
    mask = (torch.arange(per_seq * bs)[None, :] < lens[:, None])[:, None, None, :]
    q = torch.randn(args.seqs, args.heads, d, dtype=dtype)
    last = layers - 1
    same = decode_attention(q, block_major, last, tables, mask)
    if not torch.equal(same, decode_attention(q, layer_major, last, tables, mask)):
        raise RuntimeError("the two layouts disagree; the benchmark is broken")
    layer_bytes = args.seqs * per_seq * bs * kvh * d * dtype.itemsize * 2
    src = torch.empty(layers, layer_bytes, dtype=torch.uint8).random_(0, 255)
    dst = torch.empty_like(src)
    bm, lm = GatherBuffers(), GatherBuffers()  # as the engine's backend: no per-call allocation
    variants: dict[str, Callable[[int], object]] = {
        "block_major": lambda i: decode_attention(q, block_major, i, tables, mask, bm),
        "layer_major": lambda i: decode_attention(q, layer_major, i, tables, mask, lm),
        "gather_block_major": lambda i: gather_blocks(block_major, i, flat, bm),
        "gather_layer_major": lambda i: gather_blocks(layer_major, i, flat, lm),
        "memcpy": lambda i: dst[i].copy_(src[i]),
    }
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    times = sample_layers(variants, layers, args.samples, clock)
    ms = {name: step_ms(t, layers) for name, t in times.items()}
    best = {name: m["best"] for name, m in ms.items()}
    return {
        "config": vars(args) | {"out": str(args.out)},
        "environment": environment(),
        "gathered_bytes_per_step": layer_bytes * layers,
        "block_major_ms": best["block_major"],
        "layer_major_ms": best["layer_major"],
        "memcpy_same_bytes_ms": best["memcpy"],
        "gather_only_block_major_ms": best["gather_block_major"],
        "gather_only_layer_major_ms": best["gather_layer_major"],
        "block_major_over_memcpy": best["block_major"] / best["memcpy"],
        "layer_major_over_memcpy": best["layer_major"] / best["memcpy"],
        "block_major_over_layer_major": best["block_major"] / best["layer_major"],
        "keep_block_major": best["block_major"] <= KEEP_BLOCK_MAJOR_UNLESS * best["layer_major"],
        "step_ms": ms,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--seqs", type=int, default=32)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--samples", type=int, default=300, help="single-layer calls per variant")
    p.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="cpu: this thread's CPU time, blind to preemption on a shared machine (one thread "
        "only); wall: perf_counter",
    )
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "kv_layout.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        raise SystemExit("--clock cpu measures one thread; use --clock wall with --threads > 1")
    torch.set_num_threads(args.threads)
    r = run(args)
    gb = r["gathered_bytes_per_step"] / 1e9
    print(f"decode attention step, {args.seqs} seqs x {args.context} tokens, {args.layers} layers,")
    print(f"  {args.threads} thread(s), {gb:.3f} GB of K+V gathered per step")
    for name in ("block_major", "layer_major"):
        label = name.replace("_", "-")
        print(f"  {label}  {r[name + '_ms']:8.1f} ms  ({r[name + '_over_memcpy']:.2f}x memcpy)")
    print(f"  memcpy       {r['memcpy_same_bytes_ms']:8.1f} ms  (same bytes, same run)")
    print(
        f"  gather only: block-major {r['gather_only_block_major_ms']:.1f} ms, "
        f"layer-major {r['gather_only_layer_major_ms']:.1f} ms"
    )
    print(f"  block-major / layer-major = {r['block_major_over_layer_major']:.2f}")
    print(f"  keep block-major: {r['keep_block_major']}")
    print(f"wrote {write_json(args.out, r)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
