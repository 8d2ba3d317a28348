"""gpt-oss's mixture-of-experts experts over packed MXFP4 weights: two grouped GEMM kernels
over tokens sorted by expert, as ``fused_moe`` (its ``align_by_expert``), that read the
weights as the checkpoint packs them (``engine.model.quant.mxfp4``: two 4-bit e2m1 codes a
byte, one e8m0 scale a block of 32 values) and decode each tile in registers: the code's
sign, exponent and mantissa bits give its value exactly, the scale byte becomes the exponent
of an fp32. The weights are never held dequantized.

The first kernel multiplies each row block by its expert's gate and up rows (interleaved in
the checkpoint: row 2 j gate j, row 2 j + 1 up j), adds their biases and applies the clamped
SwiGLU (``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``, ``g = min(gate,
limit)``); the second multiplies that by the down rows, adds the down bias and scales each
row by its routing weight. The k rows of each token are then summed. No host sync.

Shapes: x [T, H]; codes [E, rows, cols / 32, 16] and scales [E, rows, cols / 32] uint8 of
w13 [E, 2 I, H] and w2 [E, H, I]; biases [E, 2 I] and [E, H]; weights and ids [T, k].
Accumulation in fp32; outputs in x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.triton_kernels.fused_moe import align_by_expert, expert_block, row_tile
from engine.triton_kernels.layout import dot_precision, pow2

_BLOCK = 32  # values a scale covers


@triton.jit
def _mxfp4_tile(codes_ptr, scales_ptr, rows, ks, mask, K, DTYPE: tl.constexpr):
    """W^T tile [BLOCK_K, BLOCK_N] of weight rows ``rows`` [BLOCK_N] (int64, the expert's
    offset included) at input columns ``ks`` [BLOCK_K], decoded to DTYPE."""
    groups = K // 32
    byte = rows[None, :] * (groups * 16) + (ks // 2)[:, None]  # 16 bytes a group of 32
    packed = tl.load(codes_ptr + byte, mask=mask, other=0).to(tl.int32)
    code = (packed >> ((ks % 2) * 4)[:, None]) & 15
    exponent, mantissa = (code >> 1) & 3, code & 1
    normal = (((exponent + 126) << 23) | (mantissa << 22)).to(tl.float32, bitcast=True)
    magnitude = tl.where(exponent == 0, 0.5 * mantissa.to(tl.float32), normal)
    value = tl.where(code >= 8, -magnitude, magnitude)
    s = tl.load(scales_ptr + rows[None, :] * groups + (ks // 32)[:, None], mask=mask, other=127)
    s = s.to(tl.int32)
    scale = tl.where(s == 0, 5.877471754111438e-39, (s << 23).to(tl.float32, bitcast=True))
    return (value * scale).to(DTYPE)


@triton.jit
def _mxfp4_gate_up_kernel(
    x_ptr,  # [T, H]
    codes_ptr,  # [E, 2 I, H / 32, 16] uint8
    scales_ptr,  # [E, 2 I, H / 32] uint8
    bias_ptr,  # [E, 2 I] fp32, read when HAS_BIAS
    out_ptr,  # [T * k, I]: swiglu(gate, up) per slot
    slots_ptr,  # [padded] int32
    block_expert_ptr,  # [blocks] int32
    stride_x,
    stride_o,
    num_slots,
    H,
    INTER,
    alpha,
    limit,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    expert, slots, valid = expert_block(slots_ptr, block_expert_ptr, num_slots, BLOCK_M)
    if expert >= 0:
        tokens = (slots // TOP_K).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < INTER
        gate_rows = expert * 2 * INTER + 2 * cols  # [BLOCK_N]; up rows follow each
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < H
            a = row_tile(x_ptr, tokens, stride_x, ks, H, valid)  # [BLOCK_M, BLOCK_K]
            w_mask = k_ok[:, None] & col_ok[None, :]
            wg = _mxfp4_tile(codes_ptr, scales_ptr, gate_rows, ks, w_mask, H, a.dtype)
            wu = _mxfp4_tile(codes_ptr, scales_ptr, gate_rows + 1, ks, w_mask, H, a.dtype)
            acc_g = tl.dot(a, wg, acc_g, input_precision=PRECISION)
            acc_u = tl.dot(a, wu, acc_u, input_precision=PRECISION)
        if HAS_BIAS:
            acc_g += tl.load(bias_ptr + gate_rows, mask=col_ok, other=0.0)[None, :]
            acc_u += tl.load(bias_ptr + gate_rows + 1, mask=col_ok, other=0.0)[None, :]
        g = tl.minimum(acc_g, limit)
        u = tl.minimum(tl.maximum(acc_u, -limit), limit)
        h = (u + 1.0) * (g / (1.0 + tl.exp(-alpha * g)))
        dst = out_ptr + slots[:, None].to(tl.int64) * stride_o + cols[None, :]
        tl.store(dst, h.to(out_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _mxfp4_down_kernel(
    h_ptr,  # [T * k, I]
    codes_ptr,  # [E, H, I / 32, 16] uint8
    scales_ptr,  # [E, H, I / 32] uint8
    bias_ptr,  # [E, H] fp32, read when HAS_BIAS
    out_ptr,  # [T * k, H]: weight * (down(h) + bias) per slot
    weights_ptr,  # [T * k] fp32
    slots_ptr,
    block_expert_ptr,
    stride_h,
    stride_o,
    num_slots,
    H,
    INTER,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    expert, slots, valid = expert_block(slots_ptr, block_expert_ptr, num_slots, BLOCK_M)
    if expert >= 0:
        rows = slots.to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < H
        w_rows = expert * H + cols
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < INTER
            a = row_tile(h_ptr, rows, stride_h, ks, INTER, valid)
            w_mask = k_ok[:, None] & col_ok[None, :]
            wd = _mxfp4_tile(codes_ptr, scales_ptr, w_rows, ks, w_mask, INTER, a.dtype)
            acc = tl.dot(a, wd, acc, input_precision=PRECISION)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + w_rows, mask=col_ok, other=0.0)[None, :]
        acc = acc * tl.load(weights_ptr + rows, mask=valid, other=0.0)[:, None]
        dst = out_ptr + rows[:, None] * stride_o + cols[None, :]
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


def mxfp4_moe(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    w13: tuple[torch.Tensor, torch.Tensor],
    w2: tuple[torch.Tensor, torch.Tensor],
    biases: tuple[torch.Tensor, torch.Tensor] | None,
    alpha: float,
    limit: float,
    block_m: int | None = None,
) -> torch.Tensor:
    """sum_i weights[t, i] * expert_{ids[t, i]}(x[t]) -> [T, H] in x's dtype, an expert being
    ``W2 swiglu(W13 x + b13) + b2`` with the clamped SwiGLU over W13's interleaved rows;
    ``w13`` and ``w2`` are (codes, scales) pairs."""
    (codes13, scales13), (codes2, scales2) = w13, w2
    tokens, hidden = x.shape
    experts, two_inter = codes13.shape[:2]
    inter = two_inter // 2
    if (
        hidden % _BLOCK
        or inter % _BLOCK
        or codes13.shape != (experts, two_inter, hidden // _BLOCK, 16)
        or codes2.shape != (experts, hidden, inter // _BLOCK, 16)
        or scales13.shape != codes13.shape[:3]
        or scales2.shape != codes2.shape[:3]
    ):
        raise ValueError(
            f"mxfp4_moe: x {tuple(x.shape)}, w13 {tuple(codes13.shape)} and w2 "
            f"{tuple(codes2.shape)} do not fit [T, H], [E, 2 I, H / 32, 16], [E, H, I / 32, 16]"
        )
    if ids.shape != weights.shape or ids.dim() != 2 or ids.shape[0] != tokens:
        raise ValueError(f"mxfp4_moe: ids {tuple(ids.shape)} and weights must be [{tokens}, k]")
    top_k, num_slots = ids.shape[1], ids.numel()
    if num_slots == 0:
        return torch.zeros_like(x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    b13, b2 = (x, x) if biases is None else (b.float().contiguous() for b in biases)
    block_m = block_m or (16 if num_slots <= 8 * experts else 64)
    align = align_by_expert(ids, experts, block_m)
    blocks = align.block_expert.shape[0]
    h = torch.empty(num_slots, inter, dtype=x.dtype, device=x.device)
    ys = torch.empty(num_slots, hidden, dtype=x.dtype, device=x.device)
    common = {"HAS_BIAS": biases is not None, "PRECISION": dot_precision(x.dtype)}
    bn = min(64, pow2(inter, 16))
    _mxfp4_gate_up_kernel[(blocks, triton.cdiv(inter, bn))](
        x, codes13, scales13, b13, h, align.slots, align.block_expert,
        x.stride(0), h.stride(0), num_slots, hidden, inter, alpha, limit,
        TOP_K=top_k, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=_BLOCK, **common,
    )  # fmt: skip
    bn = min(64, pow2(hidden, 16))
    _mxfp4_down_kernel[(blocks, triton.cdiv(hidden, bn))](
        h, codes2, scales2, b2, ys, weights.reshape(-1).float().contiguous(), align.slots,
        align.block_expert, h.stride(0), ys.stride(0), num_slots, hidden, inter,
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=_BLOCK, **common,
    )  # fmt: skip
    return ys.view(tokens, top_k, hidden).sum(dim=1)
