"""Weight-only FP8 GEMM: ``x @ W.T`` with W held as e4m3 codes and a scale per tile.

The weight stays as published (``Fp8Weight``: codes [out, in] float8_e4m3fn, scales per
(``block[0]`` rows, ``block[1]`` columns); a tensor or channel scale is one tile wide). Each
program owns a tile of output columns for a tile of rows; per K tile it loads the codes,
widens them to fp32, multiplies by their tile's scale and runs the dot in the activation's
dtype, accumulating in fp32. Activations are not quantized (a weight-only kernel; vLLM's
``_scaled_mm`` path quantizes activations to fp8 as well, which changes the numbers), so the
result equals a matmul with the dequantized weight up to rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.model.quant.fp8_checkpoint import Fp8Weight
from engine.triton_kernels.layout import dot_precision, pow2


@triton.jit
def _fp8_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K] float8_e4m3fn
    s_ptr,  # [ceil(N / SN), ceil(K / SK)] fp32
    out_ptr,  # [M, N]
    M,
    N,
    K,
    stride_xm,
    stride_w,
    stride_s,
    stride_om,
    SN: tl.constexpr,
    SK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w_mask = k_ok[:, None] & col_ok[None, :]
        codes = tl.load(
            w_ptr + cols[None, :].to(tl.int64) * stride_w + ks[:, None], mask=w_mask, other=0.0
        )  # [BLOCK_K, BLOCK_N]
        scale = tl.load(
            s_ptr + (cols // SN)[None, :] * stride_s + (ks // SK)[:, None], mask=w_mask, other=0.0
        )
        w = (codes.to(tl.float32) * scale).to(a.dtype)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
    dst = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def fp8_linear(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """x [M, in] @ W.T -> [M, out] in x's dtype; ``w``'s tensors on x's device."""
    n, k = w.shape
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"fp8_linear: x {tuple(x.shape)} does not fit a weight of {k} inputs")
    x = x if x.stride(-1) == 1 else x.contiguous()
    codes, scales = w.codes.contiguous(), w.scales.float().contiguous()
    m = x.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    bm, bn, bk = min(64, pow2(m, 16)), min(64, pow2(n, 16)), min(64, pow2(k, 16))
    _fp8_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        x, codes, scales, out, m, n, k,
        x.stride(0), codes.stride(0), scales.stride(0), out.stride(0),
        SN=w.block[0], SK=w.block[1], BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        PRECISION=dot_precision(x.dtype),
    )  # fmt: skip
    return out
