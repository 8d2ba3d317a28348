"""One prompt's whole prefill on the CPU, the C prefill attention kernel on and off, interleaved.

    python -m bench.prefill_cpu [--model smollm2] [--tokens 384] [--rounds 8] [--threads 2]

The engine (fp32, packed weights as served, no prefix caching, so every round computes the
whole prompt) prefills one prompt of ``--tokens`` seeded random token ids and samples one
token; each round times it with the kernel (the default) and with the torch path it replaces
(SDPA per chunk, ``engine.cpu_kernels.prefill_supported`` made False), alternating which runs
first. Best wall time (and best process CPU time, steadier on a shared machine, summed over
threads) of the rounds each; the wall time as FLOPs per second (2 x decoder weights x
tokens, plus the causal attention's) over the same run's fp32 matmul peak.
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


def prefill_seconds(llm: Any, ids: list[int], kernel: bool) -> tuple[float, float]:
    """Wall and process CPU time of one prefill (+ one sampled token) with the C prefill
    kernel on or off."""
    from engine import cpu_kernels
    from models.sampling_params import SamplingParams

    supported = cpu_kernels.prefill_supported
    if not kernel:
        cpu_kernels.prefill_supported = lambda *_: False  # type: ignore[assignment]
    try:
        start, cpu = time.perf_counter(), time.process_time()
        llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        return time.perf_counter() - start, time.process_time() - cpu
    finally:
        cpu_kernels.prefill_supported = supported  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "prefill_cpu.json")
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
    for kernel in (True, False):  # warm both paths (kernel build, buffers)
        prefill_seconds(llm, ids, kernel)
    times: dict[str, list[tuple[float, float]]] = {"c_kernel": [], "torch_sdpa": []}
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for kernel in order:
            times["c_kernel" if kernel else "torch_sdpa"].append(prefill_seconds(llm, ids, kernel))
    peak = matmul_peak_gflops(torch.float32, n=1024, seconds=1.0)
    best = {k: min(w for w, _ in v) for k, v in times.items()}
    cpu = {k: min(c for _, c in v) for k, v in times.items()}
    result: dict[str, Any] = {
        "benchmark": "prefill_cpu",
        "args": {k: str(v) for k, v in vars(args).items()},
        "environment": environment(),
        "fp32_matmul_peak_gflop_s": peak,
        "prefill_ms_best": {k: v * 1e3 for k, v in best.items()},
        "prefill_cpu_ms_best": {k: v * 1e3 for k, v in cpu.items()},
        "prefill_ms_all": {k: [w * 1e3 for w, _ in v] for k, v in times.items()},
        "speedup": best["torch_sdpa"] / best["c_kernel"],
        "speedup_cpu_time": cpu["torch_sdpa"] / cpu["c_kernel"],
    }
    flops = prefill_flops(json.loads((Path(model_dir) / "config.json").read_text()), args.tokens)
    result["prefill_gflop"] = flops / 1e9
    result["ratio_to_matmul_peak"] = {k: flops / v / 1e9 / peak for k, v in best.items()}
    print(f"prefill of {args.tokens} tokens, {args.threads} threads, fp32 matmul peak {peak:.0f}")
    for k, v in best.items():
        ratio = result["ratio_to_matmul_peak"][k]
        print(
            f"  {k:>10}: best {v * 1e3:7.1f} ms, {ratio:.2f} of the peak; CPU {cpu[k] * 1e3:.1f} ms"
        )
        print(f"  {'':>10}  all rounds (ms): {sorted(round(w * 1e3) for w, _ in times[k])}")
    print(f"  speedup {result['speedup']:.2f}x (CPU time {result['speedup_cpu_time']:.2f}x)")
    print(f"wrote {write_json(args.out, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
