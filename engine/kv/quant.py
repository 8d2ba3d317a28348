"""Quantized KV cache rows: int8 or fp8 (e4m3) codes with one fp32 scale per token and KV head.

``kv_cache_dtype`` (vLLM's name) is ``auto`` (the model dtype), ``int8`` or ``fp8_e4m3``.
A quantized cache keeps the block-major shape and stores each (token, KV head) row as
``head_dim`` one-byte codes followed by the 4 bytes of its fp32 scale: the cache's last dim is
``head_dim + 4``. The scale lives inside the block, so whatever moves blocks (transfers, KV
tiers, swap, prefix copies) moves the scales with them, and a new token never re-quantises
the tokens already in its block (a per-block scale would have to grow and re-code them).
Symmetric absmax: int8 ``scale = absmax / 127``, fp8 ``scale = absmax / 448`` (e4m3's
largest finite value); ``x ~= code * scale``.
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3")
SCALE_BYTES = 4  # one fp32 scale per (token, KV head) row, after the row's codes
CODE_DTYPES = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
CODE_MAX = {"int8": 127.0, "fp8_e4m3": 448.0}


def check_kv_cache_dtype(value: str, field: str = "kv_cache_dtype") -> str:
    """``value`` when it names a KV cache dtype, else ValueError naming the field."""
    if value not in KV_CACHE_DTYPES:
        raise ValueError(f"{field} must be one of {', '.join(KV_CACHE_DTYPES)}, got {value!r}")
    return value


def kv_dtype_of(kv_cache: torch.Tensor) -> str:
    """The ``kv_cache_dtype`` of a cache tensor: ``int8``, ``fp8_e4m3`` or ``auto``."""
    return next((name for name, d in CODE_DTYPES.items() if d == kv_cache.dtype), "auto")


def is_quantized(kv_cache: torch.Tensor) -> bool:
    """Whether ``kv_cache`` holds codes + scales (a one-byte code dtype)."""
    return kv_cache.dtype in (torch.int8, torch.float8_e4m3fn)


def quantize_rows(x: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
    """x: [..., d] float -> [..., d + 4] code rows (codes, then the fp32 scale's bytes)."""
    code = CODE_DTYPES[kv_cache_dtype]
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / CODE_MAX[kv_cache_dtype]  # [..., 1]
    scaled = xf / torch.where(scale > 0, scale, torch.ones_like(scale))
    if code == torch.int8:
        codes = scaled.round().clamp_(-127, 127).to(torch.int8)
    else:
        codes = scaled.clamp_(-448.0, 448.0).to(code)
    scale_bytes = scale.contiguous().view(torch.int8)  # [..., 4]
    return torch.cat([codes.view(torch.int8), scale_bytes], dim=-1).view(code)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """rows: [..., d + 4] codes + scale (a one-byte code dtype) -> [..., d] of ``dtype``."""
    codes, scales = split_rows(rows)
    return (codes.float() * scales).to(dtype)


def split_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows: [..., d + 4] -> codes [..., d] (a view) and fp32 scales [..., 1]."""
    d = rows.shape[-1] - SCALE_BYTES
    scales = rows[..., d:].contiguous().view(torch.float32)
    return rows[..., :d], scales


def row_width(head_dim: int, kv_cache_dtype: str) -> int:
    """Elements of one (token, KV head) row in the cache tensor."""
    return head_dim + (SCALE_BYTES if kv_cache_dtype != "auto" else 0)


def convert_rows(
    rows: torch.Tensor, src_kv_dtype: str, dst_kv_dtype: str, model_dtype: torch.dtype
) -> torch.Tensor:
    """Rows of one cache's format in another's (``auto``: ``model_dtype`` values)."""
    if src_kv_dtype == dst_kv_dtype:
        return rows
    values = rows if src_kv_dtype == "auto" else dequantize_rows(rows, torch.float32)
    if dst_kv_dtype == "auto":
        return values.to(model_dtype)
    return quantize_rows(values, dst_kv_dtype)
