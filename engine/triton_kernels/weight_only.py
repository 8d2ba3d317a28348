"""The weight-only GEMM both quantized formats run: ``x @ W.T`` with W dequantized tile by tile.

One kernel; its ``FORMAT`` picks how a [BLOCK_K, BLOCK_N] tile of W^T is read:
- ``INT4``: GPTQ's packing, codes eight to an int32 down the input dimension ([in / 8, out]),
  a scale and a zero point per (group of ``GROUP`` inputs, output column), ``(q - z) s``
  (``engine.triton_kernels.w4a16``);
- ``FP8``: e4m3 codes [out, in] and a scale per (``SN`` rows, ``SK`` columns) tile
  (``engine.triton_kernels.fp8_linear``).
Each program owns a tile of output columns for a tile of rows; the tile is dequantized in fp32,
the dot runs in the activation's dtype and accumulates in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.triton_kernels.layout import dot_precision, pow2

INT4, FP8 = 0, 1


@triton.jit
def _weight_tile(w_ptr, s_ptr, z_ptr, ks, cols, mask, stride_w, stride_s, FORMAT: tl.constexpr,
                 GROUP: tl.constexpr, SN: tl.constexpr, SK: tl.constexpr):  # fmt: skip
    """W^T[ks, cols] in fp32."""
    if FORMAT == 0:
        words = tl.load(w_ptr + (ks // 8)[:, None] * stride_w + cols[None, :], mask=mask)
        codes = (words >> ((ks % 8) * 4)[:, None]) & 0xF
        groups = (ks // GROUP)[:, None] * stride_s + cols[None, :]
        scale = tl.load(s_ptr + groups, mask=mask, other=0.0).to(tl.float32)
        zero = tl.load(z_ptr + groups, mask=mask, other=0.0).to(tl.float32)
        return (codes.to(tl.float32) - zero) * scale
    codes = tl.load(
        w_ptr + cols[None, :].to(tl.int64) * stride_w + ks[:, None], mask=mask, other=0.0
    )
    scale = tl.load(
        s_ptr + (cols // SN)[None, :] * stride_s + (ks // SK)[:, None], mask=mask, other=0.0
    )
    return codes.to(tl.float32) * scale


@triton.jit
def _weight_only_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, M, N, K, stride_xm, stride_w, stride_s, stride_om,
    FORMAT: tl.constexpr, GROUP: tl.constexpr, SN: tl.constexpr, SK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
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
        )  # [BLOCK_M, BLOCK_K]
        mask = k_ok[:, None] & col_ok[None, :]
        w = _weight_tile(w_ptr, s_ptr, z_ptr, ks, cols, mask, stride_w, stride_s, FORMAT,
                         GROUP, SN, SK)  # fmt: skip
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision=PRECISION)
    dst = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def weight_only_linear(
    x: torch.Tensor,
    n: int,
    fmt: int,
    weight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None = None,
    group: int = 1,
    tile: tuple[int, int] = (1, 1),
) -> torch.Tensor:
    """x [M, K] (unit last stride) @ W.T -> [M, n] in x's dtype, W as ``fmt`` describes."""
    m, k = x.shape
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    bm, bn, bk = min(64, pow2(m, 16)), min(64, pow2(n, 16)), min(64, pow2(k, 16))
    _weight_only_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        x, weight, scales, scales if zeros is None else zeros, out, m, n, k,
        x.stride(0), weight.stride(0), scales.stride(0), out.stride(0),
        FORMAT=fmt, GROUP=group, SN=tile[0], SK=tile[1], BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        PRECISION=dot_precision(x.dtype),
    )  # fmt: skip
    return out
