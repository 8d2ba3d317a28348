"""One prompt's whole prefill on the CPU, two ways interleaved: the C prefill attention kernel
on and off, or (``--compare precision``) float32_matmul_precision highest against medium.

    python -m bench.prefill_cpu [--model smollm2] [--tokens 384] [--rounds 8] [--threads 2]
                                [--compare kernel|precision]

The engine (fp32, packed weights as served, no prefix caching, so every round computes the
whole prompt) prefills one prompt of ``--tokens`` seeded random token ids and samples one
token; each round times it with the kernel (the default) and with the torch path it replaces
(SDPA per chunk, ``engine.cpu_kernels.prefill_supported`` made False), alternating which runs
first. With ``--compare precision`` the same engine runs each round with its packed layers'
products and whole-prompt attention in bf16 inputs on AMX tiles ("medium", where the build
has them) and fp32-accurate ("highest"), alternating. Best wall time (and best process CPU
time, steadier on a shared machine, summed over threads) of the rounds each; the wall time
as FLOPs per second (2 x decoder weights x tokens, plus the causal attention's) over the same
run's fp32 matmul peak (and, comparing precisions, its bf16 peak).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, environment, matmul_peak_gflops, write_json


def prefill_flops(config: dict[str, Any], tokens: int) -> float:
    """2 x decoder weights x tokens (linear layers) + causal attention's 4 x heads x d per
    attended pair, over all layers (a Llama-shaped config.json)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or hidden // heads
    weights = hidden * (heads + 2 * kv_heads) * d + heads * d * hidden + 3 * hidden * inter
    attention = 4 * heads * d * tokens * (tokens + 1) // 2
    return float(config["num_hidden_layers"] * (2 * weights * tokens + attention))


def prefill_seconds(llm: Any, ids: list[int], variant: str) -> tuple[float, float]:
    """Wall and process CPU time of one prefill (+ one sampled token) in ``variant``:
    c_kernel / torch_sdpa (the C prefill kernel on or off), or highest / medium (the
    float32_matmul_precision the model's layers run at)."""
    from engine import cpu_kernels
    from models.sampling_params import SamplingParams

    supported = cpu_kernels.prefill_supported
    if variant == "torch_sdpa":
        cpu_kernels.prefill_supported = lambda *_: False  # type: ignore[assignment]
    if variant in ("highest", "medium"):
        llm.engine.runner.model.use_bf16_products(variant == "medium")
    try:
        start, cpu = time.perf_counter(), time.process_time()
        llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        return time.perf_counter() - start, time.process_time() - cpu
    finally:
        cpu_kernels.prefill_supported = supported  # type: ignore[assignment]


VARIANTS = {"kernel": ("c_kernel", "torch_sdpa"), "precision": ("medium", "highest")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compare", choices=sorted(VARIANTS), default="kernel")
    ap.add_argument(
        "--out", type=Path, default=None, help="default results/prefill_cpu[_precision].json"
    )
    args = ap.parse_args(argv)
    from engine import cpu_kernels
    from engine.llm import LLM
    from models import ensure_model

    if not cpu_kernels.available():
        print("no C kernels here: nothing to compare", file=sys.stderr)
        return 0
    torch.set_num_threads(args.threads)
    model_dir = ensure_model(args.model)
    llm = LLM(model_dir, dtype="float32", enable_prefix_caching=False)
    rng = random.Random(0)
    ids = [rng.randrange(100, 40000) for _ in range(args.tokens)]
    fast, slow = VARIANTS[args.compare]
    if args.compare == "precision" and not llm.engine.runner.model.use_bf16_products(True):
        print("medium changes nothing here (no AMX tiles, or no packed weights)", file=sys.stderr)
    for variant in (fast, slow):  # warm both paths (kernel build, buffers)
        prefill_seconds(llm, ids, variant)
    times: dict[str, list[tuple[float, float]]] = {fast: [], slow: []}
    for r in range(args.rounds):
        for variant in (fast, slow) if r % 2 == 0 else (slow, fast):
            times[variant].append(prefill_seconds(llm, ids, variant))
    peaks = {"fp32": matmul_peak_gflops(torch.float32, n=1024)}
    if args.compare == "precision":
        peaks["bf16"] = matmul_peak_gflops(torch.bfloat16, n=1024)
    best = {k: min(w for w, _ in v) for k, v in times.items()}
    cpu = {k: min(c for _, c in v) for k, v in times.items()}
    flops = prefill_flops(json.loads((Path(model_dir) / "config.json").read_text()), args.tokens)
    result: dict[str, Any] = {
        "benchmark": "prefill_cpu",
        "args": {k: str(v) for k, v in vars(args).items()},
        "environment": environment(),
        "fp32_matmul_peak_gflop_s": peaks["fp32"],
        "matmul_peak_gflop_s": peaks,
        "prefill_ms_best": {k: v * 1e3 for k, v in best.items()},
        "prefill_cpu_ms_best": {k: v * 1e3 for k, v in cpu.items()},
        "prefill_ms_all": {k: [w * 1e3 for w, _ in v] for k, v in times.items()},
        "speedup": best[slow] / best[fast],
        "speedup_cpu_time": cpu[slow] / cpu[fast],
        "prefill_gflop": flops / 1e9,
        "ratio_to_matmul_peak": {
            f"{k}/{dtype}": flops / v / 1e9 / peak
            for k, v in best.items()
            for dtype, peak in peaks.items()
        },
    }
    shown = ", ".join(f"{dtype} {peak:.0f}" for dtype, peak in peaks.items())
    print(f"prefill of {args.tokens} tokens, {args.threads} threads, matmul peaks {shown} GFLOP/s")
    for k, v in best.items():
        ratios = ", ".join(
            f"{result['ratio_to_matmul_peak'][f'{k}/{dtype}']:.2f} of the {dtype} peak"
            for dtype in peaks
        )
        print(f"  {k:>10}: best {v * 1e3:7.1f} ms, {ratios}; CPU {cpu[k] * 1e3:.1f} ms")
        print(f"  {'':>10}  all rounds (ms): {sorted(round(w * 1e3) for w, _ in times[k])}")
    print(f"  speedup {result['speedup']:.2f}x (CPU time {result['speedup_cpu_time']:.2f}x)")
    default = "prefill_cpu.json" if args.compare == "kernel" else "prefill_cpu_precision.json"
    print(f"wrote {write_json(args.out or RESULTS_DIR / default, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
