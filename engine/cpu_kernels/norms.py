"""RMSNorm kernels (``fused_ops.c``): over whole rows, and over each head of a row in place
(the per-head q and k norms of Qwen3 and Gemma 3)."""

from __future__ import annotations

import ctypes
import functools

import torch

from engine import cpu_kernels

_I64, _I32, _F32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [tokens, hidden] fp32 (unit last stride) scaled by weight [hidden]."""
    lib = _lib()
    if x.stride(-1) != 1 or not weight.is_contiguous():
        raise ValueError("rms_norm: x needs a unit last stride and weight to be contiguous")
    out = torch.empty(x.shape, dtype=x.dtype)
    lib.splitserve_rms_norm_f32(
        x.data_ptr(), x.stride(0), weight.data_ptr(), out.data_ptr(), out.stride(0),
        x.shape[0], x.shape[1], eps, torch.get_num_threads(),
    )  # fmt: skip
    return out


def head_norm_(x: torch.Tensor, heads: int, weight: torch.Tensor, eps: float) -> None:
    """RMSNorm of each head of x [tokens, heads * d] fp32 (unit last stride, any row stride)
    over its d values, in place, scaled by weight [d]."""
    lib = _lib()
    tokens, width = x.shape
    if x.stride(-1) != 1 or not weight.is_contiguous() or x.dtype != torch.float32:
        raise ValueError("head_norm_: x needs fp32 with a unit last stride, weight contiguous")
    if width != heads * weight.shape[0]:
        raise ValueError(f"head_norm_: {width} columns are not {heads} heads of {weight.shape[0]}")
    lib.splitserve_head_norm_f32(
        x.data_ptr(), x.stride(0), tokens, heads, weight.shape[0], weight.data_ptr(), eps,
        torch.get_num_threads(),
    )  # fmt: skip


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = cpu_kernels._require()
    lib.splitserve_rms_norm_f32.restype = None
    lib.splitserve_rms_norm_f32.argtypes = [_P, _I64, _P, _P, _I64, _I32, _I32, _F32, _I32]
    lib.splitserve_head_norm_f32.restype = None
    lib.splitserve_head_norm_f32.argtypes = [_P, _I64, _I32, _I32, _I32, _P, _F32, _I32]
    return lib
