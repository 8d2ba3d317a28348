"""Rotate-half rotary embedding applied to q and k in place, one program per token."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.triton_kernels.layout import pow2


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
    """Rotate all heads of one token of x: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin."""
    h = tl.arange(0, HEADS_PAD)
    i = tl.arange(0, HALF_PAD)
    mask = (h < H)[:, None] & (i < HALF)[None, :]
    p1 = x_ptr + row * stride_t + h[:, None] * stride_h + i[None, :]  # [HEADS_PAD, HALF_PAD]
    x1 = tl.load(p1, mask=mask, other=0.0)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0)
    f1 = x1.to(tl.float32)
    f2 = x2.to(tl.float32)
    tl.store(p1, (f1 * cos[None, :] - f2 * sin[None, :]).to(x1.dtype), mask=mask)
    tl.store(p1 + HALF, (f2 * cos[None, :] + f1 * sin[None, :]).to(x1.dtype), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr,  # [tokens, heads, d]
    k_ptr,  # [tokens, kv_heads, d]
    pos_ptr,  # [tokens]
    cache_ptr,  # [max_position, d]: cos half | sin half
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_c,
    Q_HEADS: tl.constexpr,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    i = tl.arange(0, HALF_PAD)
    c_ptr = cache_ptr + pos * stride_c + i
    cos = tl.load(c_ptr, mask=i < HALF, other=0.0).to(tl.float32)
    sin = tl.load(c_ptr + HALF, mask=i < HALF, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, row, stride_qt, stride_qh, cos, sin, Q_HEADS, Q_HEADS_PAD, HALF, HALF_PAD)
    _rotate_heads(k_ptr, row, stride_kt, stride_kh, cos, sin, K_HEADS, K_HEADS_PAD, HALF, HALF_PAD)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q ``[tokens, heads, d]`` and k ``[tokens, kv_heads, d]`` in place; returns both.

    positions: [tokens] absolute positions; cos_sin_cache: [max_position, d] with the cos
    half first (see ``reference.rope_cos_sin_cache``). q and k may be strided views.
    """
    tokens, heads, head_dim = q.shape
    if k.dim() != 3 or k.shape[0] != tokens or k.shape[2] != head_dim or head_dim % 2:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} do not match (even d)")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(f"cos_sin_cache must be [max_position, {head_dim}]")
    if positions.shape != (tokens,):
        raise ValueError(f"positions must be [{tokens}], got {tuple(positions.shape)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or cos_sin_cache.stride(-1) != 1:
        raise ValueError("q, k and cos_sin_cache need a contiguous last dimension")
    if tokens == 0:
        return q, k
    half = head_dim // 2
    _rope_kernel[(tokens,)](
        q, k, positions, cos_sin_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        Q_HEADS=heads, Q_HEADS_PAD=pow2(heads), K_HEADS=k.shape[1],
        K_HEADS_PAD=pow2(k.shape[1]), HALF=half, HALF_PAD=pow2(half), num_warps=1,
    )  # fmt: skip
    return q, k
