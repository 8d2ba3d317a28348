"""Weight-only int4 GEMM (w4a16): ``x @ W.T`` with W read as 4-bit codes, dequantized in tiles.

The weight is held as ``Int4Packed``: codes packed eight to an int32 down the input dimension
(``qweight`` [in / 8, out], nibble i of word r is input row ``8 r + i``: GPTQ's layout, which
AWQ checkpoints are repacked into at load), and a scale and a zero point per (group of
``group`` input rows, output column) ([in / group, out]). Each program owns a tile of output
columns for a tile of rows; per K tile it loads the packed words once per nibble row (the
eight rows sharing a word hit the cache), shifts the nibbles out, dequantizes
``(code - zero) * scale`` in fp32 and multiplies in the activation's dtype, accumulating in
fp32. Activation-ordered checkpoints carry ``perm``: the input columns are gathered into the
codes' order before the kernel, so every group is contiguous.

Accumulation order differs from a dequantize-then-matmul by rounding only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from engine.model.quant.int4_checkpoint import Int4Weight
from engine.triton_kernels.layout import dot_precision, pow2


class Int4Packed(NamedTuple):
    """An int4 weight in the kernel's layout (see the module's docstring)."""

    qweight: torch.Tensor  # [in / 8, out] int32
    scales: torch.Tensor  # [in / group, out], the activation dtype
    zeros: torch.Tensor  # [in / group, out], the activation dtype, code units
    group: int
    perm: torch.Tensor | None  # [in] int64: the input column each code row reads

    @property
    def in_features(self) -> int:
        return self.qweight.shape[0] * 8

    @property
    def out_features(self) -> int:
        return self.qweight.shape[1]


def pack_int4(w: Int4Weight, dtype: torch.dtype, device: torch.device | str) -> Int4Packed:
    """``w`` in the kernel's layout, on ``device``; the input width must be a multiple of 8."""
    out, inp = w.shape
    if inp % 8:
        raise ValueError(f"int4 weight with {inp} input columns: not a multiple of 8")
    codes = w.codes.t().reshape(inp // 8, 8, out).to(torch.int32)  # [in / 8, 8, out]
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)[None, :, None]
    words = (codes << shifts).sum(dim=1, dtype=torch.int64)  # nibbles never overlap
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return Int4Packed(
        qweight=words.contiguous().to(device),
        scales=w.scales.t().contiguous().to(device, dtype),
        zeros=w.zeros.t().contiguous().to(device, dtype),
        group=w.group_size,
        perm=None if w.perm is None else w.perm.to(device),
    )


@triton.jit
def _w4a16_kernel(
    x_ptr,  # [M, K]
    qw_ptr,  # [K / 8, N] int32
    s_ptr,  # [K / GROUP, N]
    z_ptr,  # [K / GROUP, N]
    out_ptr,  # [M, N]
    M,
    N,
    K,
    stride_xm,
    stride_qw,
    stride_s,
    stride_om,
    GROUP: tl.constexpr,
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
        )  # [BLOCK_M, BLOCK_K]
        w_mask = k_ok[:, None] & col_ok[None, :]
        words = tl.load(qw_ptr + (ks // 8)[:, None] * stride_qw + cols[None, :], mask=w_mask)
        codes = (words >> ((ks % 8) * 4)[:, None]) & 0xF  # [BLOCK_K, BLOCK_N]
        groups = (ks // GROUP)[:, None] * stride_s + cols[None, :]
        scale = tl.load(s_ptr + groups, mask=w_mask, other=0.0).to(tl.float32)
        zero = tl.load(z_ptr + groups, mask=w_mask, other=0.0).to(tl.float32)
        w = ((codes.to(tl.float32) - zero) * scale).to(a.dtype)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
    dst = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def w4a16_linear(x: torch.Tensor, w: Int4Packed) -> torch.Tensor:
    """x [M, in] @ W.T -> [M, out] in x's dtype."""
    if x.dim() != 2 or x.shape[1] != w.in_features:
        raise ValueError(
            f"w4a16_linear: x {tuple(x.shape)} does not fit a weight of {w.in_features} inputs"
        )
    if w.perm is not None:
        x = x.index_select(1, w.perm)
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, n, k = x.shape[0], w.out_features, w.in_features
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    block_m = min(64, pow2(m, 16))
    block_n = min(64, pow2(n, 16))
    block_k = min(64, pow2(k, 16))
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _w4a16_kernel[grid](
        x,
        w.qweight,
        w.scales,
        w.zeros,
        out,
        m,
        n,
        k,
        x.stride(0),
        w.qweight.stride(0),
        w.scales.stride(0),
        out.stride(0),
        GROUP=w.group,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PRECISION=dot_precision(x.dtype),
    )
    return out
