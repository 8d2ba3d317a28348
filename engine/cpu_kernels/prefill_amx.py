"""Causal prefill attention on AMX tiles in bf16 products (``prefill_attention_amx.c``): the
prefill half of the CPU attention backend where the engine runs with
float32_matmul_precision "medium" and every prompt of the step is computed without a cached
prefix (no window, no soft-cap); elsewhere, or where the build has no AMX, the fp32 kernel
(``engine.cpu_kernels.prefill``) runs."""

from __future__ import annotations

import ctypes
import functools

import torch

from engine import cpu_kernels
from engine.cpu_kernels.prefill import check_query_offsets

_I64, _I32, _F32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p


def prompt_offsets(query_start_loc: torch.Tensor, tokens: int) -> torch.Tensor:
    """``query_start_loc`` checked to cover ``tokens`` tokens in prompts of at least one,
    as the int32 offsets ``prefill_attention_bf16`` takes (the engine passes its step's
    ``PrefillIndex.query_start_loc``, checked the same way)."""
    offsets = query_start_loc.to(torch.int32).contiguous()
    if offsets.dim() != 1 or offsets.shape[0] < 1:
        raise ValueError("prefill_attention_bf16: query offsets must be [prompts + 1]")
    check_query_offsets(offsets, tokens, "prefill_attention_bf16")
    return offsets


def prefill_attention_bf16(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor, scale: float
) -> torch.Tensor | None:
    """Attention of whole prompts over their own K/V, causal: prompt i owns tokens
    ``offsets[i] .. offsets[i + 1] - 1`` (``prompt_offsets``). q: [tokens, heads, d], k, v:
    [tokens, kv_heads, d], fp32 with unit last strides. Q, K, V and the softmax weights are
    rounded to bf16, scores and sums fp32. Returns [tokens, heads, d], or None where the
    kernel declines (no AMX here, d not a multiple of 32 or over 256)."""
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    if not all(t.dtype == torch.float32 and t.stride(-1) == 1 for t in (q, k, v)):
        raise ValueError("prefill_attention_bf16: q, k, v must be fp32 with unit last strides")
    if k.shape != v.shape or k.shape[0] != tokens or k.shape[2] != head_dim:
        raise ValueError(f"prefill_attention_bf16: k {tuple(k.shape)} does not match q")
    if offsets.dtype != torch.int32 or not offsets.is_contiguous() or offsets.dim() != 1:
        raise ValueError("prefill_attention_bf16: offsets must come from prompt_offsets")
    out = torch.empty(tokens, heads, head_dim, dtype=q.dtype)
    rc = _lib().splitserve_prefill_attention_amx(
        q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
        v.data_ptr(), v.stride(0), v.stride(1), out.data_ptr(), offsets.data_ptr(),
        offsets.shape[0] - 1, heads, kv_heads, head_dim, scale, torch.get_num_threads(),
    )  # fmt: skip
    if rc == 2:
        raise MemoryError("prefill_attention_bf16: out of memory")
    return out if rc == 0 else None


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = cpu_kernels._require()
    fn = lib.splitserve_prefill_attention_amx
    fn.restype = ctypes.c_int32
    fn.argtypes = [
        _P, _I64, _I64, _P, _I64, _I64, _P, _I64, _I64,  # q, k, v and their strides
        _P, _P, _I32,  # out, query offsets, prompts
        _I32, _I32, _I32, _F32, _I32,  # heads, kv heads, head dim, scale, threads
    ]  # fmt: skip
    return lib
