"""Fused mixture-of-experts experts: two grouped GEMM kernels over tokens sorted by expert.

The step's (token, slot) pairs are sorted by expert and each expert's run padded to a
multiple of ``BLOCK_M`` (``align_by_expert``), so every row block of the sorted order
belongs to one expert. One kernel multiplies each block by its expert's fused gate/up weight
and applies the activation (``act(gate) * up``) before storing; the second multiplies that
by the down weight and scales each row by its routing weight. The k rows of each token are
then summed. Built on device tensors only: no host sync, so a CUDA graph can hold it (the
grid covers the most blocks the step could need; the ones past the last expert return).

Shapes: x [T, H]; w13 [E, 2 I, H] (gate rows, then up rows); w2 [E, H, I]; weights and ids
[T, k]. Accumulation in fp32; outputs in x's dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from engine.triton_kernels.layout import dot_precision, pow2

ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


class Alignment(NamedTuple):
    """The sorted order: ``slots`` [padded] int32 holds slot ids t * k + i grouped by expert,
    each expert's run padded with T * k up to a multiple of ``block_m``; ``block_expert``
    [padded / block_m] int32 is each row block's expert, -1 past the last one."""

    slots: torch.Tensor
    block_expert: torch.Tensor
    block_m: int


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """Group the slots of ``ids`` [T, k] by expert into ``block_m``-row blocks (no host sync)."""
    flat = ids.reshape(-1)
    n = flat.numel()
    dev = ids.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m  # [E]
    ends = padded.cumsum(0)
    order = flat.argsort(stable=True)  # slot ids, expert by expert
    expert = flat[order]
    rank = torch.arange(n, device=dev) - (counts.cumsum(0) - counts)[expert]
    capacity = n + min(num_experts, n) * (block_m - 1)  # each used expert pads < block_m rows
    blocks = -(-capacity // block_m)
    slots = torch.full((blocks * block_m,), n, dtype=torch.int32, device=dev)
    slots[(ends - padded)[expert] + rank] = order.to(torch.int32)
    starts = torch.arange(blocks, device=dev) * block_m
    block_expert = torch.searchsorted(ends, starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return Alignment(slots, block_expert, block_m)


@triton.jit
def _act(g, ACT: tl.constexpr):
    if ACT == 0:
        return g / (1.0 + tl.exp(-g))  # SiLU
    u = 0.7978845608028654 * (g + 0.044715 * g * g * g)  # GELU, tanh approximation
    return g - g / (tl.exp(2.0 * u) + 1.0)


@triton.jit
def expert_block(slots_ptr, block_expert_ptr, num_slots, BLOCK_M: tl.constexpr):
    """This program's row block of the sorted order: its expert (-1 past the last one), its
    slot ids [BLOCK_M] and which of them are real (not padding)."""
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    slots = tl.load(slots_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    return expert, slots, slots < num_slots


@triton.jit
def row_tile(ptr, rows, stride, ks, K, valid):
    """[BLOCK_M, BLOCK_K] of the rows ``rows`` (int64) at columns ``ks``: 0 past K and in
    the rows that are not ``valid``."""
    mask = valid[:, None] & (ks < K)[None, :]
    return tl.load(ptr + rows[:, None] * stride + ks[None, :], mask=mask, other=0.0)


@triton.jit
def _gate_up_kernel(
    x_ptr,  # [T, H]
    w_ptr,  # [E, 2 I, H]
    out_ptr,  # [T * k, I]: act(gate) * up per slot
    slots_ptr,  # [padded] int32
    block_expert_ptr,  # [blocks] int32
    stride_x,
    stride_we,
    stride_wn,
    stride_o,
    num_slots,
    H,
    INTER,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ACT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    expert, slots, valid = expert_block(slots_ptr, block_expert_ptr, num_slots, BLOCK_M)
    if expert >= 0:
        tokens = (slots // TOP_K).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < INTER
        w = w_ptr + expert * stride_we + cols[None, :] * stride_wn  # [1, BLOCK_N] gate rows
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < H
            a = row_tile(x_ptr, tokens, stride_x, ks, H, valid)  # [BLOCK_M, BLOCK_K]
            w_mask = k_ok[:, None] & col_ok[None, :]
            wg = tl.load(w + ks[:, None], mask=w_mask, other=0.0)  # [BLOCK_K, BLOCK_N]
            wu = tl.load(w + INTER * stride_wn + ks[:, None], mask=w_mask, other=0.0)
            acc_g = tl.dot(a, wg, acc_g, input_precision=PRECISION)
            acc_u = tl.dot(a, wu, acc_u, input_precision=PRECISION)
        h = _act(acc_g, ACT) * acc_u
        dst = out_ptr + slots[:, None].to(tl.int64) * stride_o + cols[None, :]
        tl.store(dst, h.to(out_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(
    h_ptr,  # [T * k, I]
    w_ptr,  # [E, H, I]
    out_ptr,  # [T * k, H]: weight * down(h) per slot
    weights_ptr,  # [T * k] fp32
    slots_ptr,
    block_expert_ptr,
    stride_h,
    stride_we,
    stride_wn,
    stride_o,
    num_slots,
    H,
    INTER,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    expert, slots, valid = expert_block(slots_ptr, block_expert_ptr, num_slots, BLOCK_M)
    if expert >= 0:
        rows = slots.to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < H
        w = w_ptr + expert * stride_we + cols[None, :] * stride_wn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < INTER
            a = row_tile(h_ptr, rows, stride_h, ks, INTER, valid)
            wd = tl.load(w + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc = tl.dot(a, wd, acc, input_precision=PRECISION)
        scale = tl.load(weights_ptr + rows, mask=valid, other=0.0)
        acc = acc * scale[:, None]
        dst = out_ptr + rows[:, None] * stride_o + cols[None, :]
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    activation: str,
    block_m: int | None = None,
) -> torch.Tensor:
    """sum_i weights[t, i] * expert_{ids[t, i]}(x[t]) -> [T, H] in x's dtype, where an expert
    is down(act(gate(x)) * up(x)), act ``"silu"`` or ``"gelu_tanh"``."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused_moe: activation {activation!r} is not one of {ACTIVATIONS}")
    tokens, hidden = x.shape
    experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    if w13.shape[2] != hidden or w2.shape != (experts, hidden, inter):
        raise ValueError(
            f"fused_moe: x {tuple(x.shape)}, w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} "
            "do not fit [T, H], [E, 2 I, H], [E, H, I]"
        )
    if ids.shape != weights.shape or ids.dim() != 2 or ids.shape[0] != tokens:
        raise ValueError(f"fused_moe: ids {tuple(ids.shape)} and weights must be [{tokens}, k]")
    top_k, num_slots = ids.shape[1], ids.numel()
    if num_slots == 0:
        return torch.zeros_like(x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    w13, w2 = w13.contiguous(), w2.contiguous()
    if block_m is None:  # small blocks while experts get few rows each (decode)
        block_m = 16 if num_slots <= 8 * experts else 64
    align = align_by_expert(ids, experts, block_m)
    blocks = align.block_expert.shape[0]
    h = torch.empty(num_slots, inter, dtype=x.dtype, device=x.device)
    ys = torch.empty(num_slots, hidden, dtype=x.dtype, device=x.device)
    precision = dot_precision(x.dtype)
    bn, bk = min(64, pow2(inter, 16)), min(64, pow2(hidden, 16))
    _gate_up_kernel[(blocks, triton.cdiv(inter, bn))](
        x, w13, h, align.slots, align.block_expert,
        x.stride(0), w13.stride(0), w13.stride(1), h.stride(0), num_slots, hidden, inter,
        TOP_K=top_k, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, ACT=ACTIVATIONS[activation],
        PRECISION=precision,
    )  # fmt: skip
    bn, bk = min(64, pow2(hidden, 16)), min(64, pow2(inter, 16))
    _down_kernel[(blocks, triton.cdiv(hidden, bn))](
        h, w2, ys, weights.reshape(-1).float().contiguous(), align.slots, align.block_expert,
        h.stride(0), w2.stride(0), w2.stride(1), ys.stride(0), num_slots, hidden, inter,
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, PRECISION=precision,
    )  # fmt: skip
    return ys.view(tokens, top_k, hidden).sum(dim=1)
