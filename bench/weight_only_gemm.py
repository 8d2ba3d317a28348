"""Weight-only GEMMs on CUDA (int4 w4a16, FP8 e4m3) against limits measured in the same run.

    python -m bench.weight_only_gemm --out bench/results/weight_only_gemm.json
    python -m bench.weight_only_gemm --shapes o --rows 1 16 --sweep  # the kernels' tiles

For each projection shape (Llama-3-8B's by default) and each row count M, the products of
the same weight, in bf16 activations:
- ``bf16``: torch's ``F.linear`` on the dequantized weight (cuBLAS), the baseline;
- ``w4a16``: ``engine.triton_kernels.w4a16`` as the engine calls it (codes prepacked at load, a
  scale and zero per 128 inputs): its decode kernel up to ``DECODE_ROWS`` rows, the tiled
  kernel above; at decode rows also ``w4a16_tiled``, the tiled kernel on the same codes;
- ``fp8``: ``engine.triton_kernels.fp8_linear`` (e4m3 codes, a scale per output channel).
Few rows are bound by reading the weight: the figure is weight bytes / time against the
same-run DRAM traffic of a device-to-device copy (``read / copy``). Many rows are bound by
compute: TFLOP/s against the same-run bf16 matmul of 8192^3 (``/ peak``). Every case also
reports its speed-up over the bf16 product and its error against it. Weights are cycled
through enough copies that L2 never holds the working set; each case is timed as CUDA-graph
replays (``bench.kernels.time_ms``). Without CUDA it runs a tiny case under TRITON_INTERPRET=1
only to show that the code path works: those figures are meaningless.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, environment, triton_device, write_json
from bench.kernels import bench_copy, time_ms
from bench.weight_only_report import report

# (name, out features N, in features K): Llama-3-8B's projections (q/k/v and gate/up fused)
LLAMA_8B = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
L2_FLUSH_BYTES = 512 << 20  # the weights a case cycles through, well above any L2
GROUP = 128
CROSSOVER_ROWS = [32, 64, 128, 256, 512]
SWEEP_ROWS = [1, 16]


def act_dtype(device: torch.device) -> torch.dtype:
    """bf16 activations; fp16 under the interpreter, whose bf16 dots are not exact."""
    return torch.bfloat16 if device.type == "cuda" else torch.float16


def make_weights(n: int, k: int, device: torch.device) -> dict[str, Any]:
    """One random weight in the three forms: int4 (random codes, scales, zeros), its fp8
    rounding with a scale per output channel, and bf16 copies of what each dequantizes to."""
    from engine.model.quant.fp8_checkpoint import Fp8Weight
    from engine.model.quant.int4_checkpoint import Int4Weight
    from engine.triton_kernels.w4a16 import pack_int4

    groups = k // GROUP
    int4 = Int4Weight(
        codes=torch.randint(0, 16, (n, k), dtype=torch.uint8),
        scales=torch.rand(n, groups) * 0.02 + 0.001,
        zeros=torch.randint(0, 16, (n, groups)).float(),
        group_size=GROUP,
        perm=None,
    )
    dense = int4.dequantize(torch.float32)
    scale = dense.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 448.0
    fp8 = Fp8Weight(
        codes=(dense / scale).to(torch.float8_e4m3fn).to(device),
        scales=scale.to(device),
        block=(1, k),
    )
    return {
        "int4": pack_int4(int4, act_dtype(device), device),
        "fp8": fp8,
        "bf16_int4": dense.to(device, act_dtype(device)),
        "bf16_fp8": fp8.dequantize(torch.float32).to(act_dtype(device)),
    }


def weight_bytes(w: dict[str, Any]) -> dict[str, int]:
    """Bytes each product reads for its weight."""

    def size(*ts: torch.Tensor) -> int:
        return sum(t.numel() * t.element_size() for t in ts)

    q, f = w["int4"], w["fp8"]
    int4 = size(q.qweight, q.scales, q.zeros)  # the padded words: what the kernels read
    return {
        "bf16": size(w["bf16_int4"]),
        "w4a16": int4,
        "w4a16_tiled": int4,
        "fp8": size(f.codes, f.scales),
    }


def products(w: dict[str, Any], **how: Any) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """The products of one weight. ``how``: ``decode`` (a ``DecodeConfig``) goes to the int4
    decode kernel, the rest (``fused``, ``dequant``) to ``weight_only_linear``, the tiled
    kernel (default: their own choices)."""
    from engine.triton_kernels.w4a16 import w4a16_linear
    from engine.triton_kernels.w4a16_decode import int4_decode_linear
    from engine.triton_kernels.weight_only import FP8, INT4, weight_only_linear

    q, f = w["int4"], w["fp8"]
    tiled = {key: v for key, v in how.items() if key != "decode"}

    def w4a16_tiled(x: torch.Tensor) -> torch.Tensor:
        n = q.out_features
        return weight_only_linear(x, n, INT4, q.qweight, q.scales, q.zeros, q.group, **tiled)

    def w4a16_decode(x: torch.Tensor) -> torch.Tensor:
        args = (q.qweight, q.scales, q.zeros, q.out_features, q.group, how.get("decode"))
        return int4_decode_linear(x, *args)

    def fp8(x: torch.Tensor) -> torch.Tensor:
        n = f.codes.shape[0]
        return weight_only_linear(x, n, FP8, f.codes, f.scales.float(), tile=f.block, **tiled)

    return {
        "bf16": lambda x: torch.nn.functional.linear(x, w["bf16_int4"]),
        "w4a16": lambda x: w4a16_linear(x, q),
        "w4a16_tiled": w4a16_tiled,
        "w4a16_decode": w4a16_decode,
        "fp8": fp8,
    }


def timed(
    weights: list[dict[str, Any]], kind: str, x: torch.Tensor, iters: int, cuda: bool, **how: Any
) -> float:
    """Milliseconds of one product, cycling through the weight copies."""
    calls = [products(w, **how)[kind] for w in weights]
    turn = itertools.count()
    return time_ms(lambda: calls[next(turn) % len(calls)](x), iters, cuda)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def bench_shape(
    name: str, n: int, k: int, rows: list[int], iters: int, device: torch.device, copy_gbps: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The cases of one shape, and the weight copies they cycled through."""
    from engine.triton_kernels.w4a16 import decodes

    cuda = device.type == "cuda"
    first = make_weights(n, k, device)
    nbytes = weight_bytes(first)
    copies = max(1, min(32, -(-L2_FLUSH_BYTES // nbytes["w4a16"]))) if cuda else 1
    weights = [first] + [make_weights(n, k, device) for _ in range(copies - 1)]
    calls = products(first)
    out = []
    for m in rows:
        x = torch.randn(m, k, device=device).to(act_dtype(device))
        # the tiled int4 kernel beside the decode kernel, where the engine takes the latter
        kinds = ["bf16", "w4a16", "fp8"] + (["w4a16_tiled"] if decodes(m, first["int4"]) else [])
        case: dict[str, Any] = {"shape": name, "n": n, "k": k, "m": m, "weight_copies": copies}
        case["w4a16_kernel"] = "decode" if decodes(m, first["int4"]) else "tiled"
        for kind in kinds:
            ms = timed(weights, kind, x, iters, cuda)
            case[kind] = {
                "time_ms": ms,
                "tflops": 2 * m * n * k / (ms * 1e-3) / 1e12,
                "weight_gbps": nbytes[kind] / (ms * 1e-3) / 1e9,
                "read_over_copy": nbytes[kind] / (ms * 1e-3) / 1e9 / copy_gbps,
                "weight_bytes": nbytes[kind],
            }
        for kind in kinds[1:]:
            # the error of each kernel against cuBLAS on the weight it dequantizes to
            dense = first["bf16_fp8" if kind == "fp8" else "bf16_int4"]
            case[kind]["speedup_vs_bf16"] = case["bf16"]["time_ms"] / case[kind]["time_ms"]
            case[kind]["rel_err_vs_cublas"] = rel_err(calls[kind](x), x @ dense.t())
        out.append(case)
    return out, weights


def crossover(
    weights: list[dict[str, Any]], k: int, rows: list[int], iters: int, cuda: bool
) -> list[dict[str, Any]]:
    """The tiled kernel against dequantize-then-matmul at each row count (``DEQUANT_ROWS``)."""
    out = []
    device = weights[0]["bf16_int4"].device
    for m in rows:
        x = torch.randn(m, k, device=device).to(act_dtype(device))
        case: dict[str, Any] = {"m": m}
        for kind, product in (("w4a16", "w4a16_tiled"), ("fp8", "fp8")):
            case[kind] = {
                "fused_ms": timed(weights, product, x, iters, cuda, dequant=False),
                "dequant_ms": timed(weights, product, x, iters, cuda, dequant=True),
            }
        out.append(case)
    return out


def sweep(
    weights: list[dict[str, Any]], k: int, rows: list[int], iters: int, cuda: bool
) -> list[dict[str, Any]]:
    """At each row count: the tiled kernel's tiles and input splits (int4, fp8) and the int4
    decode kernel's splits, stages and warps; the best of each and the plan's."""
    from engine.triton_kernels.w4a16_decode import DecodeConfig, plan_decode
    from engine.triton_kernels.weight_only import FP8, INT4, FusedConfig, plan_fused

    device = weights[0]["bf16_int4"].device
    q = weights[0]["int4"]
    n, tile_n = q.out_features, q.qweight.shape[2]
    tiled = [(bn, bk, sp, st) for bn in (32, 64, 128) for bk in (128, 256) for sp in (1, 2, 4, 8)
             for st in (2, 3)]  # fmt: skip
    decode = [(sp, st, wa) for sp in (1, 2, 4, 8, 12, 16) for st in (2, 3, 4) for wa in (4, 8)]
    if not cuda:
        tiled, decode = tiled[:2], decode[:2]
    out = []
    for m in rows:
        x = torch.randn(m, k, device=device).to(act_dtype(device))
        for kind, fmt in (("w4a16_tiled", INT4), ("fp8", FP8)):
            plan = plan_fused(m, n, k, fmt, act_dtype(device), device)
            how = {c: {"fused": FusedConfig(*c), "dequant": False} for c in [*tiled, tuple(plan)]}
            out.append(_best(weights, kind, x, how, tuple(plan), iters, cuda))
        plan_d = tuple(plan_decode(m, n, k, tile_n, device))
        how = {c: {"decode": DecodeConfig(*c)} for c in [*decode, plan_d]}
        out.append(_best(weights, "w4a16_decode", x, how, plan_d, iters, cuda))
    return out


def _best(
    weights: list[dict[str, Any]],
    kind: str,
    x: torch.Tensor,
    how: dict[tuple[int, ...], dict[str, Any]],
    plan: tuple[int, ...],
    iters: int,
    cuda: bool,
) -> dict[str, Any]:
    """Each configuration of ``kind`` timed; the best and the plan's."""
    from triton.runtime.errors import OutOfResources

    times = {}
    for config, kwargs in how.items():
        try:
            times[config] = timed(weights, kind, x, iters, cuda, **kwargs)
        except OutOfResources:  # too many stages of too large tiles
            continue
    best = min(times, key=lambda c: times[c])
    return {
        "m": x.shape[0],
        "kind": kind,
        "best": {"config": list(best), "ms": times[best]},
        "plan": {"config": list(plan), "ms": times.get(plan, float("nan"))},
        "all": {"/".join(map(str, c)): t for c, t in times.items()},
    }


def matmul_peak_tflops(n: int, iters: int, device: torch.device) -> float:
    a = torch.randn(n, n, device=device).to(act_dtype(device))
    b = torch.randn(n, n, device=device).to(act_dtype(device))
    ms = time_ms(lambda: a @ b, iters, device.type == "cuda")
    return 2 * n**3 / (ms * 1e-3) / 1e12


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256, 2048])
    ap.add_argument("--shapes", nargs="+", default=[s[0] for s in LLAMA_8B],
                    choices=[s[0] for s in LLAMA_8B])  # fmt: skip
    ap.add_argument("--iters", type=int, default=20, help="products per timed graph replay")
    ap.add_argument(
        "--crossover", type=int, nargs="*", metavar="M",
        help=f"time the tiled kernel against dequantize + matmul at these row counts "
        f"(none named: {CROSSOVER_ROWS})",
    )  # fmt: skip
    ap.add_argument(
        "--sweep", type=int, nargs="*", metavar="M",
        help=f"time the tiled kernel's tiles and splits and the int4 decode kernel's splits, "
        f"stages and warps, at these row counts (none named: {SWEEP_ROWS})",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "weight_only_gemm.json")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = triton_device()
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    if cuda:
        shapes = [s for s in LLAMA_8B if s[0] in args.shapes]
        rows, iters = args.rows, args.iters
    else:  # the interpreter runs each program in Python: keep it tiny
        shapes, rows, iters = [("tiny", 32, 2 * GROUP)], [1, 3], 1
    copy = bench_copy(256 << 20 if cuda else 1 << 20, iters, device)
    peak = matmul_peak_tflops(8192 if cuda else 64, max(iters // 4, 1), device)
    cases: list[dict[str, Any]] = []
    crossovers: dict[str, list[dict[str, Any]]] = {}
    sweeps: dict[str, list[dict[str, Any]]] = {}
    result = {
        "cuda": cuda,
        "meaningful": cuda,
        "environment": environment(),
        "copy_traffic_gbps": copy["traffic_gbps"],
        "matmul_peak_tflops": peak,
        "group_size": GROUP,
        "cases": cases,
        "crossover": crossovers,
        "sweep": sweeps,
        "complete": False,
    }
    for name, n, k in shapes:
        print(f"{name}: N {n}, K {k}", flush=True)
        found, weights = bench_shape(name, n, k, rows, iters, device, copy["traffic_gbps"])
        cases += found
        if args.crossover is not None:
            at = (args.crossover or CROSSOVER_ROWS) if cuda else [2]
            crossovers[name] = crossover(weights, k, at, iters, cuda)
        if args.sweep is not None:
            sweeps[name] = sweep(
                weights, k, (args.sweep or SWEEP_ROWS) if cuda else [1], iters, cuda
            )
        del weights
        write_json(args.out, result)  # each shape as it is done: a long sweep can be cut off
    result["complete"] = True
    report(result)
    print(f"wrote {write_json(args.out, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
