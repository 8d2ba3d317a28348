"""Multi-LoRA shrink and expand over a per-token slot index (Punica style), for CUDA.

``lora_shrink``: y[t] = a[slot[t]] @ x[t]; ``lora_expand_add_``: out[t, cols of sub i] +=
b[slot[t], those cols] @ y[t, i * R : (i + 1) * R]. Tokens whose slot is negative get zeros
from the shrink and no delta. Accumulates in fp32; tested against ``engine.lora.delta`` under
the interpreter.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from engine.triton_kernels.layout import pow2

_BLOCK_K = 64  # input features per shrink iteration
_BLOCK_N = 64  # output columns per expand program


@triton.jit
def _shrink_kernel(
    x_ptr,  # [T, in]
    a_ptr,  # [slots, rows, in]
    slots_ptr,  # [T] int64
    y_ptr,  # [T, rows] fp32
    stride_x,
    stride_as,
    stride_y,
    IN: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t)
    r = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    if slot >= 0:
        for k0 in range(0, IN, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + t * stride_x + k, mask=k < IN, other=0.0).to(tl.float32)
            a_mask = (r[:, None] < ROWS) & (k[None, :] < IN)
            a_ptrs = a_ptr + slot * stride_as + r[:, None] * IN + k[None, :]
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
            acc += tl.sum(a.to(tl.float32) * x[None, :], axis=1)
    tl.store(y_ptr + t * stride_y + r, acc, mask=r < ROWS)


@triton.jit
def _expand_kernel(
    out_ptr,  # [T, N]
    y_ptr,  # [T, subs * R] fp32
    b_ptr,  # [slots, N, R]
    slots_ptr,  # [T] int64
    stride_o,
    stride_y,
    stride_bs,
    y_offset,  # this sub-matrix's first column of y
    col_lo,
    col_hi,
    RANK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t)
    if slot >= 0:
        cols = col_lo + tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        r = tl.arange(0, BLOCK_R)
        col_mask = cols < col_hi
        y = tl.load(y_ptr + t * stride_y + y_offset + r, mask=r < RANK, other=0.0)
        b_mask = col_mask[:, None] & (r[None, :] < RANK)
        b = tl.load(b_ptr + slot * stride_bs + cols[:, None] * RANK + r[None, :], mask=b_mask)
        delta = tl.sum(b.to(tl.float32) * y[None, :], axis=1)
        o = tl.load(out_ptr + t * stride_o + cols, mask=col_mask, other=0.0)
        tl.store(
            out_ptr + t * stride_o + cols, (o.to(tl.float32) + delta).to(o.dtype), mask=col_mask
        )


def lora_shrink(x: torch.Tensor, a: torch.Tensor, token_slots: torch.Tensor) -> torch.Tensor:
    """x [T, in] (unit last stride), a [slots, rows, in] contiguous, token_slots [T] int64
    -> y [T, rows] fp32."""
    tokens, rows, features = x.shape[0], a.shape[1], a.shape[2]
    y = torch.empty(tokens, rows, dtype=torch.float32, device=x.device)
    if tokens:
        _shrink_kernel[(tokens,)](
            x, a, token_slots, y, x.stride(0), a.stride(0), y.stride(0),
            IN=features, ROWS=rows, BLOCK_R=pow2(rows), BLOCK_K=min(_BLOCK_K, pow2(features)),
        )  # fmt: skip
    return y


def lora_expand_add_(
    out: torch.Tensor,
    y: torch.Tensor,
    b: torch.Tensor,
    token_slots: torch.Tensor,
    ends: Sequence[int],
) -> None:
    """out [T, N] (unit last stride) += each sub-matrix's b[slot] @ y slice, in place."""
    tokens, rank = out.shape[0], b.shape[2]
    if not tokens:
        return
    lo = 0
    for i, hi in enumerate(ends):
        grid = (tokens, triton.cdiv(hi - lo, _BLOCK_N))
        _expand_kernel[grid](
            out, y, b, token_slots, out.stride(0), y.stride(0), b.stride(0), i * rank, lo, hi,
            RANK=rank, BLOCK_R=pow2(rank), BLOCK_N=_BLOCK_N,
        )  # fmt: skip
        lo = hi
