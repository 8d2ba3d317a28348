"""Rotate-half rotary embedding applied to q and k in place, one program per token.

``rope_write_kv`` also stores the rotated K and the V of each token in the paged cache in the
same program, so the layer's K / V make one trip through memory instead of two; into a
quantized cache (int8 / fp8 e4m3 rows) it stores the rows ``quantize_rows`` would write.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.triton_kernels.kv_quant import cache_views, store_rows
from engine.triton_kernels.layout import kv_layer_view, pow2


@triton.jit
def _rotate_heads(
    x_ptr,
    row,
    stride_t,
    stride_h,
    cos,
    sin,
    H: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    """Rotate all heads of one token of x in place: x1' = x1 cos - x2 sin, x2' = x2 cos +
    x1 sin. Returns the rotated halves [HEADS_PAD, HALF_PAD] in x's dtype."""
    h = tl.arange(0, HEADS_PAD)
    i = tl.arange(0, HALF_PAD)
    mask = (h < H)[:, None] & (i < HALF)[None, :]
    p1 = x_ptr + row * stride_t + h[:, None] * stride_h + i[None, :]  # [HEADS_PAD, HALF_PAD]
    x1 = tl.load(p1, mask=mask, other=0.0)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0)
    f1 = x1.to(tl.float32)
    f2 = x2.to(tl.float32)
    r1 = (f1 * cos[None, :] - f2 * sin[None, :]).to(x1.dtype)
    r2 = (f2 * cos[None, :] + f1 * sin[None, :]).to(x1.dtype)
    tl.store(p1, r1, mask=mask)
    tl.store(p1 + HALF, r2, mask=mask)
    return r1, r2


@triton.jit
def _rope_kernel(
    q_ptr,  # [tokens, heads, d]
    k_ptr,  # [tokens, kv_heads, d]
    v_ptr,  # [tokens, kv_heads, d], read when WRITE_KV
    pos_ptr,  # [tokens]
    cache_ptr,  # [max_position, d]: cos half | sin half
    kv_ptr,  # the paged cache (its bytes when QUANT), written when WRITE_KV
    param_ptr,  # the cache as bf16 (scales and mids) when QUANT
    slot_ptr,  # [tokens] int64, read when WRITE_KV
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_c,
    layer_offset,
    v_offset,
    stride_cb,
    stride_ct,
    stride_ch,
    Q_HEADS: tl.constexpr,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    WRITE_KV: tl.constexpr,
    QUANT: tl.constexpr,  # 0: model dtype; 1: int8 rows; 2: fp8 e4m3 rows
):
    row = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    i = tl.arange(0, HALF_PAD)
    c_ptr = cache_ptr + pos * stride_c + i
    cos = tl.load(c_ptr, mask=i < HALF, other=0.0).to(tl.float32)
    sin = tl.load(c_ptr + HALF, mask=i < HALF, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, row, stride_qt, stride_qh, cos, sin, Q_HEADS, Q_HEADS_PAD, HALF, HALF_PAD)
    k1, k2 = _rotate_heads(
        k_ptr, row, stride_kt, stride_kh, cos, sin, K_HEADS, K_HEADS_PAD, HALF, HALF_PAD
    )
    if WRITE_KV:
        slot = tl.load(slot_ptr + row).to(tl.int64)
        live = slot >= 0  # a negative slot (a CUDA graph's padding row) writes nothing
        slot = tl.maximum(slot, 0)
        h = tl.arange(0, K_HEADS_PAD) + tl.where(live, 0, K_HEADS_PAD)  # padding: all masked
        mask = (h < K_HEADS)[:, None] & (i < HALF)[None, :]
        cell = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_ct
        src = v_ptr + row * stride_vt + h[:, None] * stride_vh + i[None, :]
        v1 = tl.load(src, mask=mask)
        v2 = tl.load(src + HALF, mask=mask)
        if QUANT:
            rows = layer_offset + cell + h * stride_ch  # [K_HEADS_PAD] bytes
            h_mask = h < K_HEADS
            f32 = tl.float32
            store_rows(
                kv_ptr, param_ptr, rows, k1.to(f32), k2.to(f32), mask, h_mask, HALF, HALF_PAD,
                QUANT,
            )  # fmt: skip
            store_rows(
                kv_ptr, param_ptr, rows + v_offset, v1.to(f32), v2.to(f32), mask, h_mask, HALF,
                HALF_PAD, QUANT,
            )  # fmt: skip
        else:
            dst = kv_ptr + layer_offset + cell + h[:, None] * stride_ch + i[None, :]
            elem = kv_ptr.dtype.element_ty
            tl.store(dst, k1.to(elem), mask=mask)
            tl.store(dst + HALF, k2.to(elem), mask=mask)
            tl.store(dst + v_offset, v1.to(elem), mask=mask)
            tl.store(dst + v_offset + HALF, v2.to(elem), mask=mask)


def _check(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    tokens, _, head_dim = q.shape
    if k.dim() != 3 or k.shape[0] != tokens or k.shape[2] != head_dim or head_dim % 2:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} do not match (even d)")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(f"cos_sin_cache must be [max_position, {head_dim}]")
    if positions.shape != (tokens,):
        raise ValueError(f"positions must be [{tokens}], got {tuple(positions.shape)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or cos_sin_cache.stride(-1) != 1:
        raise ValueError("q, k and cos_sin_cache need a contiguous last dimension")


def _heads(q: torch.Tensor, k: torch.Tensor) -> dict[str, int]:
    heads, kv_heads, half = q.shape[1], k.shape[1], q.shape[2] // 2
    return {
        "Q_HEADS": heads, "Q_HEADS_PAD": pow2(heads), "K_HEADS": kv_heads,
        "K_HEADS_PAD": pow2(kv_heads), "HALF": half, "HALF_PAD": pow2(half),
    }  # fmt: skip


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q ``[tokens, heads, d]`` and k ``[tokens, kv_heads, d]`` in place; returns both.

    positions: [tokens] absolute positions; cos_sin_cache: [max_position, d] with the cos
    half first (see ``reference.rope_cos_sin_cache``). q and k may be strided views.
    """
    _check(q, k, positions, cos_sin_cache)
    if q.shape[0] == 0:
        return q, k
    _rope_kernel[(q.shape[0],)](
        q, k, k, positions, cos_sin_cache, k, k, positions,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), 0, 0, cos_sin_cache.stride(0),
        0, 0, 0, 0, 0, **_heads(q, k), BLOCK_SIZE=1, WRITE_KV=False, QUANT=0, num_warps=1,
    )  # fmt: skip
    return q, k


def rope_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    slot_mapping: torch.Tensor,
) -> None:
    """``apply_rope(q, k, ...)`` and ``write_kv(k, v, kv, layer, slot_mapping)`` in one pass.

    q: [tokens, heads, d], k, v: [tokens, kv_heads, d] (strided views allowed); q and k are
    rotated in place; kv: [blocks, layers, 2, block, kv_heads, d] (or quantized rows, see
    ``kv_write``); slot_mapping: [tokens]
    int64, ``block_id * block_size + offset``; a negative slot (``PAD_SLOT``) writes nothing.
    """
    _check(q, k, positions, cos_sin_cache)
    view = kv_layer_view(kv, layer)
    if v.shape != k.shape or k.shape[1:] != (view.num_kv_heads, view.head_dim):
        raise ValueError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be "
            f"[tokens, {view.num_kv_heads}, {view.head_dim}]"
        )
    if slot_mapping.shape != (k.shape[0],) or v.stride(-1) != 1:
        raise ValueError("slot_mapping must be [tokens] and v needs a contiguous last dimension")
    if q.shape[0] == 0:
        return
    codes, params = cache_views(kv)
    _rope_kernel[(q.shape[0],)](
        q, k, v, positions, cos_sin_cache, codes, params, slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos_sin_cache.stride(0), view.layer_offset, view.v_offset, view.block_stride,
        view.token_stride, view.head_stride,
        **_heads(q, k), BLOCK_SIZE=view.block_size, WRITE_KV=True, QUANT=view.quant,
        num_warps=1,
    )  # fmt: skip
