"""Scatter new K / V rows into the paged cache at their slots (``block * block_size + offset``).

A quantized cache (int8 / fp8 e4m3 rows, ``engine.kv_format.rows``) gets each row quantized in the
same program: the bytes ``quantize_rows`` would write (``kv_quant``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.triton_kernels.kv_quant import cache_views, store_rows
from engine.triton_kernels.layout import kv_layer_view, pow2


@triton.jit
def _write_kv_kernel(
    k_ptr,  # [tokens, kv_heads, d]
    v_ptr,  # [tokens, kv_heads, d]
    kv_ptr,  # the whole cache (its bytes when QUANT)
    param_ptr,  # the cache as bf16, for scales and mids, when QUANT
    slot_ptr,  # [tokens] int64
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    layer_offset,
    v_offset,
    stride_cb,
    stride_ct,
    stride_ch,
    BLOCK_SIZE: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    QUANT: tl.constexpr,  # 0: model dtype; 1: int8 rows; 2: fp8 e4m3 rows
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)
    cell = layer_offset + (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_ct
    if QUANT:
        half: tl.constexpr = HEAD_DIM // 2
        half_pad: tl.constexpr = HEAD_PAD // 2
        k_src = k_ptr + token * stride_kt
        v_src = v_ptr + token * stride_vt
        rows = cell + h * stride_ch  # [HEADS_PAD] K rows, in bytes
        _write_quantized(
            k_src, stride_kh, kv_ptr, param_ptr, rows, h, KV_HEADS, half, half_pad, QUANT
        )
        _write_quantized(
            v_src, stride_vh, kv_ptr, param_ptr, rows + v_offset, h, KV_HEADS, half, half_pad,
            QUANT,
        )  # fmt: skip
    else:
        d = tl.arange(0, HEAD_PAD)
        mask = (h < KV_HEADS)[:, None] & (d < HEAD_DIM)[None, :]
        dst = kv_ptr + cell + h[:, None] * stride_ch + d[None, :]  # [HEADS_PAD, HEAD_PAD]
        elem = kv_ptr.dtype.element_ty
        k = tl.load(k_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
        tl.store(dst, k.to(elem), mask=mask)
        v = tl.load(v_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
        tl.store(dst + v_offset, v.to(elem), mask=mask)


@triton.jit
def _write_quantized(
    src_ptr,  # one token's rows [kv_heads, d]
    stride_h,
    code_ptr,
    param_ptr,
    row,  # [HEADS_PAD] byte offsets of the destination rows
    h,  # [HEADS_PAD]
    KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    QUANT: tl.constexpr,
):
    i = tl.arange(0, HALF_PAD)
    h_mask = h < KV_HEADS
    mask = h_mask[:, None] & (i < HALF)[None, :]
    src = src_ptr + h[:, None] * stride_h + i[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    store_rows(code_ptr, param_ptr, row, x1, x2, mask, h_mask, HALF, HALF_PAD, QUANT)


def write_kv(
    k: torch.Tensor, v: torch.Tensor, kv: torch.Tensor, layer: int, slot_mapping: torch.Tensor
) -> None:
    """Write k, v ``[tokens, kv_heads, d]`` into layer ``layer`` of ``kv`` in place.

    slot_mapping: [tokens] int64, ``block_id * block_size + offset`` per token; every slot
    must be valid. k and v may be strided views (e.g. slices of a fused QKV output) as long
    as the head dimension is contiguous. A quantized cache (int8 / fp8 e4m3 rows of
    ``head_dim`` + 8 bytes) stores ``quantize_rows(k)`` and ``quantize_rows(v)``.
    """
    view = kv_layer_view(kv, layer)
    if k.shape != v.shape or k.shape[1:] != (view.num_kv_heads, view.head_dim):
        raise ValueError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be "
            f"[tokens, {view.num_kv_heads}, {view.head_dim}]"
        )
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be [{k.shape[0]}], got {tuple(slot_mapping.shape)}")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("k and v need a contiguous head dimension")
    if k.shape[0] == 0:
        return
    codes, params = cache_views(kv)
    _write_kv_kernel[(k.shape[0],)](
        k, v, codes, params, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        view.layer_offset, view.v_offset, view.block_stride, view.token_stride,
        view.head_stride,
        BLOCK_SIZE=view.block_size, KV_HEADS=view.num_kv_heads,
        HEADS_PAD=pow2(view.num_kv_heads), HEAD_DIM=view.head_dim,
        HEAD_PAD=pow2(view.head_dim), QUANT=view.quant, num_warps=1,
    )  # fmt: skip
