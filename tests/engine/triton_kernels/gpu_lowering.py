"""Compile every Triton kernel of the project for an NVIDIA target without a GPU (run as a
script, interpreter off).

The interpreter accepts programs that the GPU compiler rejects (dot sizes, layouts, types), so
the CPU suite also lowers each kernel to a cubin with the ptxas bundled in the triton wheel.
The kernels are not described by hand: each launcher of ``engine.triton_kernels`` runs on CPU
tensors of real shapes (the default model's, Llama-3-8B's projections, a Qwen-MoE-sized
expert set) with the launch intercepted and the GPU's plan forced (SM count, tiles), and each
launch is compiled with the arguments, constants and options its launcher chose. A kernel of
the package that no case launches is an error, so a new kernel cannot skip this check.

Prints one ``ok <kernel> <dtype> quant=<0|1|2> shared=<bytes> byte_loads=<n>`` line per
compiled launch (``dtype``: its first tensor's; ``byte_loads``: global loads of one byte,
which a quantized cache's aligned rows must not need), then ``kernels <compiled>/<found>``;
exits non-zero on a failure or a kernel left out.

    python tests/engine/triton_kernels/gpu_lowering.py [--arch 90]
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any, NamedTuple
from unittest import mock

if os.environ.get("TRITON_INTERPRET"):
    sys.exit("run with TRITON_INTERPRET unset: the interpreter has no compiler")

import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

import engine.triton_kernels as package
from engine.kv_format.rows import CODE_DTYPES, row_width
from engine.triton_kernels import (
    decode_attention,
    fused_moe,
    kv_write,
    lora,
    mla_attention,
    mxfp4_moe,
    norm,
    prefill_attention,
    rope,
    w4a16_decode,
    weight_only,
)

_H200_SMS = 132


class Launch(NamedTuple):
    """One intercepted ``kernel[grid](...)`` call."""

    fn: JITFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Compilable(NamedTuple):
    """What ``triton.compile`` needs for a launch, as Triton's launcher specializes it (16-byte
    aligned pointers and multiples of 16 marked, ints equal to 1 made constants), and a key to
    compile each variant once."""

    signature: dict[str, str]
    constants: dict[str, Any]
    attrs: dict[tuple[int, ...], list[list[Any]]]
    options: dict[str, Any]

    def key(self, fn: JITFunction) -> str:
        parts = (self.signature, self.constants, self.attrs)
        return f"{fn.__name__} " + " ".join(str(sorted(p.items())) for p in parts)

    def dtype(self) -> str:
        """The element type of the launch's first pointer."""
        return next((t[1:] for t in self.signature.values() if t.startswith("*")), "-")


def compilable(launch: Launch) -> Compilable:
    """The launch's signature, constants, divisibility attributes and compile options."""
    names = [p.name for p in launch.fn.params]
    bound = dict(zip(names, launch.args, strict=False))
    bound |= {k: v for k, v in launch.kwargs.items() if k in names}
    missing = [n for n in names if n not in bound]
    if missing:
        raise TypeError(f"{launch.fn.__name__}: launched without {missing}")
    signature: dict[str, str] = {}
    constants: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, param in enumerate(launch.fn.params):
        value = bound[param.name]
        if param.is_constexpr:
            signature[param.name], constants[param.name] = "constexpr", value
            continue
        kind, spec = native_specialize_impl(
            CUDABackend, value, False, not param.do_not_specialize,
            not param.do_not_specialize_on_alignment,
        )  # fmt: skip
        signature[param.name] = kind
        if kind == "constexpr":
            constants[param.name] = value
        elif isinstance(spec, str):
            attrs[(i,)] = CUDABackend.parse_attr(spec)
    options = {k: v for k, v in launch.kwargs.items() if k not in names}
    return Compilable(signature, constants, attrs, options)


@contextmanager
def gpu_plan(launches: list[Launch]) -> Iterator[None]:
    """Launchers record their launches instead of running them, and plan for an H200."""

    def record(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        launches.append(Launch(self, args, kwargs))

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(JITFunction, "run", record))
        for module in (decode_attention, prefill_attention, mla_attention):
            stack.enter_context(mock.patch.object(module, "interpreted", lambda t: False))
        for module in (decode_attention, weight_only, w4a16_decode):
            stack.enter_context(mock.patch.object(module, "sm_count", lambda d: _H200_SMS))
        yield


# ---- the launches: each launcher at real shapes ---------------------------------------------

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16  # the default model


def _cache(kv_dtype: str, dtype: torch.dtype, head_dim: int) -> torch.Tensor:
    shape = (32, 2, 2, BLOCK, KV_HEADS)  # blocks, layers, K and V, tokens, heads
    if kv_dtype == "auto":
        return torch.zeros(*shape, head_dim, dtype=dtype)
    return torch.zeros(*shape, row_width(head_dim, kv_dtype), dtype=CODE_DTYPES[kv_dtype])


def _attention(kv_dtype: str, dtype: torch.dtype, head_dim: int = HEAD_DIM) -> None:
    """Decode in one pass and split (with its reduce), prefill; soft-capped on a plain cache;
    with attention sinks."""
    kv = _cache(kv_dtype, dtype, head_dim)
    tables = torch.arange(32, dtype=torch.int32).reshape(2, 16)
    ctx = torch.tensor([200, 256], dtype=torch.int32)
    softcaps = (0.0, 30.0) if kv_dtype == "auto" and dtype != torch.float32 else (0.0,)
    q = torch.zeros(2, HEADS, head_dim, dtype=dtype)
    for splits in (1, 4):
        decode_attention.paged_decode_attention(q, kv, 1, tables, ctx, 0.125, num_splits=splits)
    q = torch.zeros(48, HEADS, head_dim, dtype=dtype)
    cu_q = torch.tensor([0, 24, 48], dtype=torch.int32)
    for softcap in softcaps:
        decode_attention.paged_decode_attention(q[:2], kv, 1, tables, ctx, 0.125, softcap=softcap)
        prefill_attention.paged_prefill_attention(
            q, kv, 1, cu_q, ctx, tables, 0.125, max_q_len=24, softcap=softcap
        )
    sinks = torch.zeros(HEADS)  # gpt-oss's attention sinks, in a window, one split and four
    for splits in (1, 4):
        decode_attention.paged_decode_attention(
            q[:2], kv, 1, tables, ctx, 0.125, num_splits=splits, window=128, sinks=sinks
        )
    prefill_attention.paged_prefill_attention(
        q, kv, 1, cu_q, ctx, tables, 0.125, max_q_len=24, window=128, sinks=sinks
    )


def _mla(kv_dtype: str, dtype: torch.dtype) -> None:
    """MLA over DeepSeek-V3's latent (512 + 64) at 16 heads a rank: decodes with a chunk."""
    latent, kv_lora, heads = 576, 512, 16
    shape = (32, 2, 1, BLOCK, 1)  # blocks, layers, the latent plane, tokens, one "head"
    if kv_dtype == "auto":
        kv = torch.zeros(*shape, latent, dtype=dtype)
    else:
        kv = torch.zeros(*shape, row_width(latent, kv_dtype), dtype=CODE_DTYPES[kv_dtype])
    tables = torch.arange(32, dtype=torch.int32).reshape(2, 16)
    ctx = torch.tensor([200, 256], dtype=torch.int32)
    cu_q = torch.tensor([0, 1, 25], dtype=torch.int32)
    q = torch.zeros(25, heads, latent, dtype=dtype)
    mla_attention.paged_mla_attention(q, kv, 1, cu_q, ctx, tables, kv_lora, 0.1, 24)


def _writes(kv_dtype: str, dtype: torch.dtype) -> None:
    """KV writes alone and fused into RoPE; RoPE alone."""
    kv = _cache(kv_dtype, dtype, HEAD_DIM)
    slots = torch.arange(5, dtype=torch.int64)
    k = torch.zeros(5, KV_HEADS, HEAD_DIM, dtype=dtype)
    kv_write.write_kv(k, k.clone(), kv, 1, slots)
    q = torch.zeros(5, HEADS, HEAD_DIM, dtype=dtype)
    positions = torch.arange(5, dtype=torch.int64)
    cos_sin = torch.zeros(64, HEAD_DIM, dtype=dtype)
    rope.rope_write_kv(q, k, k.clone(), positions, cos_sin, kv, 1, slots)
    if kv_dtype == "auto":
        rope.apply_rope(q, k, positions, cos_sin)


def _layers(dtype: torch.dtype) -> None:
    """RMSNorm with and without the residual, a MoE (and one over MXFP4 experts) at decode and
    prefill sizes, LoRA."""
    x = torch.zeros(4, 576, dtype=dtype)
    norm.rms_norm(x, torch.ones(576, dtype=dtype), 1e-5)
    norm.rms_norm(x, torch.ones(576, dtype=dtype), 1e-5, residual=x.clone())
    experts, hidden, inter, top_k = 8, 256, 128, 2
    w13 = torch.zeros(experts, 2 * inter, hidden, dtype=dtype)
    w2 = torch.zeros(experts, hidden, inter, dtype=dtype)
    for tokens, activation in ((3, "silu"), (64, "gelu_tanh")):
        ids = torch.arange(tokens * top_k).reshape(tokens, top_k) % experts
        weights = torch.full((tokens, top_k), 0.5)
        x = torch.zeros(tokens, hidden, dtype=dtype)
        fused_moe.fused_moe(x, w13, w2, weights, ids, activation)
        mxfp4 = [
            (torch.zeros(experts, rows, cols // 32, 16, dtype=torch.uint8),
             torch.zeros(experts, rows, cols // 32, dtype=torch.uint8))
            for rows, cols in ((2 * inter, hidden), (hidden, inter))
        ]  # fmt: skip
        biases = (torch.zeros(experts, 2 * inter), torch.zeros(experts, hidden))
        mxfp4_moe.mxfp4_moe(x, weights, ids, *mxfp4, biases, 1.702, 7.0)
    tokens, features, rank = 4, 576, 16
    slots = torch.tensor([0, -1, 1, 0], dtype=torch.int64)
    a = torch.zeros(2, 3 * rank, features, dtype=dtype)
    y = lora.lora_shrink(torch.zeros(tokens, features, dtype=dtype), a, slots)
    b = torch.zeros(2, 3 * features, rank, dtype=dtype)
    out = torch.zeros(tokens, 3 * features, dtype=dtype)
    lora.lora_expand_add_(out, y, b, slots, [features, 2 * features, 3 * features])


def _weight_only(dtype: torch.dtype) -> None:
    """int4 and fp8 weights at Llama-3-8B's q_proj: int4's decode kernel at 1 and 16 rows
    (split inputs, their sum; also at a small model's shape), the fused tiled kernel at 64
    rows, dequantize + matmul."""
    n, k, group = 4096, 4096, 128
    words = torch.zeros(n // 128, k // 8, 128, dtype=torch.int32)  # int4_layout, tile_n 128
    params = torch.zeros(k // group, n, dtype=dtype)
    codes = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    scales = torch.zeros(n // 128, k // 128, dtype=torch.float32)
    for m in (1, 16):  # split over the 132 SMs, summed by layout.sum_splits
        x = torch.zeros(m, k, dtype=dtype)
        w4a16_decode.int4_decode_linear(x, words, params, params, n, group)
    # the default model's q/k/v (960 x 576): tiles of 64, a part block, groups of 64
    small = torch.zeros(960 // 64, 640 // 8, 64, dtype=torch.int32)
    groups = torch.zeros(576 // 64, 960, dtype=dtype)
    w4a16_decode.int4_decode_linear(
        torch.zeros(1, 576, dtype=dtype), small, groups, groups, 960, 64
    )
    for m in (16, 64, weight_only.DEQUANT_ROWS):
        x = torch.zeros(m, k, dtype=dtype)
        if m > 16:
            weight_only.weight_only_linear(x, n, weight_only.INT4, words, params, params, group)
        if m != 64:
            weight_only.weight_only_linear(x, n, weight_only.FP8, codes, scales, tile=(128, 128))


def cases() -> list[tuple[str, Callable[[], None]]]:
    """(label, launcher calls): bf16, the dtype CUDA serves, over every KV cache dtype; the
    attention also in fp32 at the tests' head size."""
    bf16 = torch.bfloat16
    out: list[tuple[str, Callable[[], None]]] = []
    for kv_dtype in ("auto", "int8", "fp8_e4m3"):
        out.append((f"attention {kv_dtype}", partial(_attention, kv_dtype, bf16)))
        out.append((f"writes {kv_dtype}", partial(_writes, kv_dtype, bf16)))
        out.append((f"mla {kv_dtype}", partial(_mla, kv_dtype, bf16)))
    out += [("layers", partial(_layers, bf16)), ("weight-only", partial(_weight_only, bf16))]
    out.append(("attention fp32", partial(_attention, "auto", torch.float32, head_dim=16)))
    return out


def project_kernels() -> set[str]:
    """Names of the package's launchable kernels: its JIT functions named ``*_kernel``."""
    found = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, JITFunction) and name.endswith("_kernel"):
                found.add(f"{module.__name__}.{name}")
    return found


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=90)
    target = GPUTarget("cuda", ap.parse_args().arch, 32)
    launches: list[Launch] = []
    with gpu_plan(launches):
        for _, run in cases():
            run()
    compiled: set[str] = set()
    seen: set[str] = set()
    for launch in launches:
        spec = compilable(launch)
        if spec.key(launch.fn) in seen:
            continue
        seen.add(spec.key(launch.fn))
        source = ASTSource(launch.fn, spec.signature, spec.constants, spec.attrs)
        kernel = triton.compile(source, target=target, options=spec.options)
        byte_loads = len(re.findall(r"ld\.global(?:\.[a-z]+)*\.[bsu]8\b", kernel.asm["ptx"]))
        print(
            f"ok {launch.fn.__name__} {spec.dtype()} quant={spec.constants.get('QUANT', 0)} "
            f"shared={kernel.metadata.shared} byte_loads={byte_loads}",
            flush=True,
        )
        compiled.add(f"{launch.fn.__module__}.{launch.fn.__name__}")
    found = project_kernels()
    print(f"kernels {len(found & compiled)}/{len(found)}")
    for name in sorted(found - compiled):
        print(f"missing {name}: no case launches it", file=sys.stderr)
    return 1 if found - compiled else 0


if __name__ == "__main__":
    raise SystemExit(main())
