"""Quantized KV rows in the Triton kernels: ``engine.kv_format.rows``'s format, bit for bit.

A row of head_dim D is D one-byte codes (int8, or fp8 e4m3 bits), then a bf16 scale per half
row, then a bf16 mid per half row. The kernels see a quantized cache twice: as bytes (codes)
and as bf16 (scales and mids, at element ``(byte offset + D) / 2``); every row offset is even.

Rows of a head_dim that is a multiple of 8 start at multiples of 8 bytes (d + 8 bytes a row,
and every stride of the cache a multiple of the row), which the readers and writers tell the
compiler (``row_starts``): without it the byte strides (216 bytes a token for 3 KV heads of 64)
are not known to be aligned and every code moves as one byte, which made the decode kernel
about 17 times slower than over a bf16 cache on an H200.

The writers reproduce ``quantize_rows`` exactly: fp32 math, correctly rounded divisions,
round-half-even to bf16 and to int8 by integer / floor arithmetic, and fp8 e4m3 bits built
from the fp32 bits (round-half-even, subnormals included), not by the hardware cast (the
interpreter truncates bf16 and misrounds fp8 at binade edges).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kv_format.rows import SCALE_BYTES, kv_dtype_of

QUANT_CODES = {"auto": 0, "int8": 1, "fp8_e4m3": 2}  # the kernels' QUANT constexpr


def quant_code(kv: torch.Tensor) -> int:
    """0 for a model-dtype cache, 1 for int8 rows, 2 for fp8 e4m3 rows."""
    return QUANT_CODES[kv_dtype_of(kv)]


def cache_views(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes view, params view) of a cache: uint8 and bf16 views of a quantized one, the
    cache itself twice otherwise. Both share the cache's storage."""
    if not quant_code(kv):
        return kv, kv
    return kv.view(torch.uint8), kv.view(torch.bfloat16)


def row_head_dim(kv: torch.Tensor) -> int:
    """head_dim of the rows in ``kv`` (its last dim less the scale bytes when quantized)."""
    return kv.shape[-1] - (SCALE_BYTES if quant_code(kv) else 0)


@triton.jit
def _rne(y):
    """Round half to even of fp32 ``y`` (|y| < 2^22), exact in every backend."""
    f = tl.floor(y)
    diff = y - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    up = (diff > 0.5) | ((diff == 0.5) & odd)
    return tl.where(up, f + 1.0, f)


@triton.jit
def bf16_round(x):
    """fp32 ``x`` rounded half-even to the nearest bf16 value, still fp32."""
    bits = x.to(tl.int32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3_bits(y):
    """fp8 e4m3fn bits (int32, 0..255) of fp32 ``y``, |y| <= 448, rounded half-even."""
    bits = y.to(tl.int32, bitcast=True)
    a = tl.abs(y)
    a_bits = a.to(tl.int32, bitcast=True)
    normal = ((a_bits + 0x7FFFF + ((a_bits >> 20) & 1)) >> 20) - (120 << 3)
    sub = _rne(a * 512.0).to(tl.int32)  # multiples of 2^-9, 8 is the smallest normal
    code = tl.where(a < 0.015625, sub, normal)
    return tl.where(bits < 0, code | 0x80, code)


@triton.jit
def quantize_group(x, mask, QUANT: tl.constexpr):
    """One channel group of rows: x [R, W] fp32, mask [R, W]. Returns (codes [R, W] uint8,
    scale [R], mid [R]), scale and mid fp32 holding bf16 values (``quantize_rows``)."""
    seen = tl.max(mask.to(tl.int32), 1) > 0  # rows with any channel (padding rows: none)
    hi = tl.where(seen, tl.max(tl.where(mask, x, float("-inf")), 1), 0.0)
    lo = tl.where(seen, tl.min(tl.where(mask, x, float("inf")), 1), 0.0)
    if QUANT == 1:
        mid = bf16_round((hi + lo) * 0.5)
        code_max = 127.0
    else:
        mid = tl.zeros_like(hi)
        code_max = 448.0
    above, below = hi - mid, mid - lo
    half = tl.where(above > below, above, below)  # torch.maximum's pick between 0 and -0
    scale = bf16_round(tl.math.div_rn(half, code_max))
    divisor = tl.where(scale > 0, scale, 1.0)
    y = tl.math.div_rn(x - mid[:, None], tl.broadcast_to(divisor[:, None], x.shape))
    if QUANT == 1:
        codes = tl.minimum(tl.maximum(_rne(y), -127.0), 127.0).to(tl.int32) & 0xFF
    else:
        codes = _e4m3_bits(tl.minimum(tl.maximum(y, -448.0), 448.0))
    return codes.to(tl.uint8), scale, mid


@triton.jit
def row_starts(ptr, row, HEAD_DIM: tl.constexpr):
    """``ptr + row``, marked 8-byte aligned when the rows are. (The mark goes on the sum:
    on a function's argument the compiler drops it.)"""
    starts = ptr + row
    if HEAD_DIM % 8 == 0:
        starts = tl.multiple_of(starts, 8)
    return starts


@triton.jit
def store_rows(
    code_ptr,  # uint8 view of the cache
    param_ptr,  # bf16 view of the cache
    row,  # [R] byte offsets of the rows
    x1,  # [R, HALF_PAD] fp32, first half of each row
    x2,  # [R, HALF_PAD] fp32, second half
    mask,  # [R, HALF_PAD]
    r_mask,  # [R]
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    QUANT: tl.constexpr,
):
    """Quantize rows of 2 * HALF channels and store codes, scales and mids."""
    i = tl.arange(0, HALF_PAD)
    c1, s1, m1 = quantize_group(x1, mask, QUANT)
    c2, s2, m2 = quantize_group(x2, mask, QUANT)
    dst = row_starts(code_ptr, row, 2 * HALF)[:, None] + i[None, :]
    tl.store(dst, c1, mask=mask)
    tl.store(dst + HALF, c2, mask=mask)
    p = param_ptr + (row + 2 * HALF) // 2  # [R]: scale 1, scale 2, mid 1, mid 2
    tl.store(p, s1.to(tl.bfloat16), mask=r_mask)
    tl.store(p + 1, s2.to(tl.bfloat16), mask=r_mask)
    tl.store(p + 2, m1.to(tl.bfloat16), mask=r_mask)
    tl.store(p + 3, m2.to(tl.bfloat16), mask=r_mask)


@triton.jit
def load_rows(
    code_ptr,  # uint8 view of the cache
    param_ptr,  # bf16 view of the cache
    row,  # [N] byte offsets of the rows
    d,  # [HEAD_PAD] channel ids
    t_mask,  # [N] rows to read
    d_mask,  # [HEAD_PAD]
    HEAD_DIM: tl.constexpr,
    QUANT: tl.constexpr,
):
    """Rows dequantized in registers: [N, HEAD_PAD] fp32, 0 where masked."""
    mask = t_mask[:, None] & d_mask[None, :]
    raw = tl.load(row_starts(code_ptr, row, HEAD_DIM)[:, None] + d[None, :], mask=mask, other=0)
    if QUANT == 1:
        codes = raw.to(tl.int8, bitcast=True).to(tl.float32)
    else:
        codes = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    # the row's scale 1, scale 2, mid 1, mid 2 in one load of 8 bytes
    j = tl.arange(0, 4)
    p = param_ptr + (row + HEAD_DIM) // 2
    if HEAD_DIM % 8 == 0:
        p = tl.multiple_of(p, 8)  # bytes: the row's end, 8-byte aligned
    params = tl.load(p[:, None] + j[None, :], mask=t_mask[:, None], other=0.0).to(tl.float32)
    s1 = tl.sum(tl.where(j == 0, params, 0.0), 1)
    s2 = tl.sum(tl.where(j == 1, params, 0.0), 1)
    m1 = tl.sum(tl.where(j == 2, params, 0.0), 1)
    m2 = tl.sum(tl.where(j == 3, params, 0.0), 1)
    first = (d < HEAD_DIM // 2)[None, :]
    scale = tl.where(first, s1[:, None], s2[:, None])
    mid = tl.where(first, m1[:, None], m2[:, None])
    return tl.where(mask, codes * scale + mid, 0.0)


@triton.jit
def load_kv_tile(
    kv_ptr,  # the cache (its bytes when QUANT)
    param_ptr,  # the cache as bf16 when QUANT
    row,  # [N] offsets of the rows (bytes when QUANT)
    d,  # [HEAD_PAD]
    t_mask,  # [N]
    d_mask,  # [HEAD_PAD]
    HEAD_DIM: tl.constexpr,
    QUANT: tl.constexpr,
):
    """A [N, HEAD_PAD] tile of K or V rows: as stored, or dequantized to fp32 when QUANT."""
    if QUANT:
        return load_rows(kv_ptr, param_ptr, row, d, t_mask, d_mask, HEAD_DIM, QUANT)
    else:
        mask = t_mask[:, None] & d_mask[None, :]
        return tl.load(kv_ptr + row[:, None] + d[None, :], mask=mask, other=0.0)
