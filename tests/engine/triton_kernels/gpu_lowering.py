"""Compile every kernel for an NVIDIA target without a GPU (run as a script, interpreter off).

The interpreter accepts programs that the GPU compiler rejects (dot sizes, layouts, types), so
the CPU suite also lowers each kernel to a cubin with the ptxas bundled in the triton wheel.
Prints one ``ok <kernel> <dtype> quant=<0|1|2> shared=<bytes> byte_loads=<n>`` line per kernel
(``byte_loads``: global loads of one byte, which a quantized cache's aligned rows must not
need); exits non-zero on the first failure.

    python tests/engine/triton_kernels/gpu_lowering.py [--arch 90]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

if os.environ.get("TRITON_INTERPRET"):
    sys.exit("run with TRITON_INTERPRET unset: the interpreter has no compiler")

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.triton_kernels import decode_attention, kv_write, norm, prefill_attention, rope

_FLOAT_ARGS = ("qk_scale", "eps")
_INT_PTRS = {"bt_ptr": "*i32", "ctx_ptr": "*i32", "cu_q_ptr": "*i32", "slot_ptr": "*i64"}
_INT_PTRS |= {"pos_ptr": "*i64"}
_FP32_PTRS = ("part_out_ptr", "part_lse_ptr", "cache_ptr")
# A quantized cache (QUANT 1 or 2) is passed as bytes (codes) and as bf16 (scales, mids).
_QUANT_PTRS = {"kv_ptr": "*u8", "param_ptr": "*bf16"}


def signature(fn: Any, dtype: str, consts: dict[str, Any]) -> dict[str, str]:
    """Triton argument types: pointers of ``dtype`` unless known otherwise, i32 scalars."""
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif consts.get("QUANT") and name in _QUANT_PTRS:
            sig[name] = _QUANT_PTRS[name]
        elif name in _INT_PTRS:
            sig[name] = _INT_PTRS[name]
        elif name in _FP32_PTRS:
            sig[name] = "*fp32"
        elif name.endswith("_ptr"):
            sig[name] = f"*{dtype}"
        else:
            sig[name] = "fp32" if name in _FLOAT_ARGS else "i32"
    return sig


def cases() -> list[tuple[Any, str, dict[str, Any], int]]:
    """(kernel, dtype, constexprs, num_warps) at the default model's shapes and the tests'."""
    decode = {"BLOCK_SIZE": 16, "GROUP": 3, "GROUP_PAD": 16, "HEAD_DIM": 64, "HEAD_PAD": 64}
    decode |= {"TILE_N": 64, "SINGLE": False, "PRECISION": "tf32", "QUANT": 0}
    decode_fp32 = decode | {"HEAD_DIM": 16, "HEAD_PAD": 16, "SINGLE": True, "PRECISION": "ieee"}
    prefill = {"BLOCK_SIZE": 16, "GROUP": 3, "HEAD_DIM": 64, "HEAD_PAD": 64, "BLOCK_M": 128}
    prefill |= {"BLOCK_N": 64, "PRECISION": "tf32", "QUANT": 0}
    rope_consts = {"Q_HEADS": 9, "Q_HEADS_PAD": 16, "K_HEADS": 3, "K_HEADS_PAD": 4}
    rope_consts |= {"HALF": 32, "HALF_PAD": 32, "BLOCK_SIZE": 16, "QUANT": 0}
    write = {"BLOCK_SIZE": 16, "KV_HEADS": 3, "HEADS_PAD": 4, "HEAD_DIM": 64, "HEAD_PAD": 64}
    write |= {"QUANT": 0}
    prefill_fp32 = prefill | {"GROUP": 8, "HEAD_DIM": 16, "HEAD_PAD": 16, "PRECISION": "ieee"}
    return [
        (decode_attention._decode_split_kernel, "bf16", decode, 4),
        (decode_attention._decode_split_kernel, "fp32", decode_fp32, 4),
        (
            decode_attention._decode_reduce_kernel,
            "bf16",
            {"HEAD_DIM": 64, "HEAD_PAD": 64, "SPLITS_PAD": 4},
            1,
        ),
        (prefill_attention._prefill_kernel, "bf16", prefill, 4),
        (prefill_attention._prefill_kernel, "fp32", prefill_fp32, 4),
        (kv_write._write_kv_kernel, "bf16", write, 1),
        (norm._rms_norm_kernel, "bf16", {"HIDDEN": 576, "BLOCK": 1024, "HAS_RESIDUAL": True}, 4),
        (rope._rope_kernel, "bf16", rope_consts | {"WRITE_KV": False}, 1),
        (rope._rope_kernel, "bf16", rope_consts | {"WRITE_KV": True}, 1),
        # int8 and fp8 e4m3 rows (engine.kv.quant): quantized writes, dequantizing reads
        (decode_attention._decode_split_kernel, "bf16", decode | {"QUANT": 1}, 4),
        (decode_attention._decode_split_kernel, "bf16", decode | {"QUANT": 2}, 4),
        (prefill_attention._prefill_kernel, "bf16", prefill | {"QUANT": 1}, 4),
        (prefill_attention._prefill_kernel, "bf16", prefill | {"QUANT": 2}, 4),
        (kv_write._write_kv_kernel, "bf16", write | {"QUANT": 1}, 1),
        (kv_write._write_kv_kernel, "bf16", write | {"QUANT": 2}, 1),
        (rope._rope_kernel, "bf16", rope_consts | {"WRITE_KV": True, "QUANT": 2}, 1),
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=90)
    target = GPUTarget("cuda", ap.parse_args().arch, 32)
    for fn, dtype, consts, warps in cases():
        source = ASTSource(fn, signature(fn, dtype, consts), consts)
        compiled = triton.compile(source, target=target, options={"num_warps": warps})
        quant = consts.get("QUANT", 0)
        byte_loads = len(re.findall(r"ld\.global(?:\.[a-z]+)*\.[bsu]8\b", compiled.asm["ptx"]))
        print(
            f"ok {fn.__name__} {dtype} quant={quant} shared={compiled.metadata.shared} "
            f"byte_loads={byte_loads}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
