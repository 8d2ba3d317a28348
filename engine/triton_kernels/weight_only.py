"""The weight-only GEMM both quantized formats run: ``x @ W.T`` with W dequantized tile by tile.

One tile reader; its ``FORMAT`` picks how a [BLOCK_K, BLOCK_N] tile of W^T is read:
- ``INT4``: the codes prepacked for the decode kernel (``engine.triton_kernels.int4_layout``:
  eight to an int32, column tiles of ``TILE_N``), a scale and a zero point per (group of
  ``GROUP`` inputs, output column), ``(q - z) s`` (``engine.triton_kernels.w4a16``). A tile
  of whole 128-input blocks inside one column tile loads its words as rows and unpacks them
  in registers (other tiles gather a word per code); a tile inside one group loads one row
  of scales and zeros;
- ``FP8``: e4m3 codes [out, in] and a scale per (``SN`` rows, ``SK`` columns) tile
  (``engine.triton_kernels.fp8_linear``).
The tile is dequantized in fp32, the dot runs in the activation's dtype and accumulates in
fp32. Two ways to use it, by the number of rows (int4 at up to ``w4a16.DECODE_ROWS`` rows takes
its own decode kernel instead, ``engine.triton_kernels.w4a16_decode``):
- fewer than ``DEQUANT_ROWS``: the fused kernel, which reads each weight byte
  once per row tile. The product is bound by reading the weight, so when the output tiles
  are too few to fill the GPU the input dimension is split too, the partial sums summed in
  a fixed order afterwards (no atomics: the same inputs give the same bits);
- ``DEQUANT_ROWS`` or more (prefill chunks): the weight is dequantized into a scratch matrix
  by the same tile reader and the product is torch's (cuBLAS): the product's cost then
  outweighs the extra pass, and cuBLAS runs it near the matmul peak.
``bench.weight_only_gemm`` measures both against cuBLAS on the bf16 weight.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from engine.triton_kernels.int4_layout import tile_codes
from engine.triton_kernels.layout import dot_precision, pow2, sm_count, sum_splits

INT4, FP8 = 0, 1
DEQUANT_ROWS = 128  # from this many rows on: dequantize, then torch's matmul


class FusedConfig(NamedTuple):
    """Tile sizes, input splits and pipeline stages of the fused kernel
    (``bench.weight_only_gemm`` sweeps them)."""

    block_n: int
    block_k: int
    splits: int
    stages: int = 2


@triton.jit
def _weight_tile(w_ptr, s_ptr, z_ptr, k0, k_end, c0, cols, col_ok, stride_w, stride_s,
                 FORMAT: tl.constexpr, GROUP: tl.constexpr, SN: tl.constexpr, SK: tl.constexpr,
                 TILE_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """W^T[k0 : k0 + BLOCK_K, cols] in fp32 (``cols`` from ``c0``); 0 at inputs from
    ``k_end`` on."""
    ks = k0 + tl.arange(0, BLOCK_K)
    k_ok = ks < k_end
    mask = k_ok[:, None] & col_ok[None, :]
    if FORMAT == 0:
        codes = tile_codes(w_ptr, k0, k_end, c0, ks, cols, mask, stride_w, TILE_N, BLOCK_K,
                           BLOCK_N)  # fmt: skip
        if GROUP % BLOCK_K == 0:  # the tile lies inside one group: one row of parameters
            g = (k0 // GROUP) * stride_s + cols
            scale = tl.load(s_ptr + g, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            zero = tl.load(z_ptr + g, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        else:
            g = (ks // GROUP)[:, None] * stride_s + cols[None, :]
            scale = tl.load(s_ptr + g, mask=mask, other=0.0).to(tl.float32)
            zero = tl.load(z_ptr + g, mask=mask, other=0.0).to(tl.float32)
        return tl.where(mask, (codes.to(tl.float32) - zero) * scale, 0.0)
    codes = tl.load(
        w_ptr + cols[None, :].to(tl.int64) * stride_w + ks[:, None], mask=mask, other=0.0
    )
    if SK % BLOCK_K == 0:  # one scale column for the tile
        scale = tl.load(s_ptr + (cols // SN) * stride_s + k0 // SK, mask=col_ok, other=0.0)[None, :]
    else:
        scale = tl.load(
            s_ptr + (cols // SN)[None, :] * stride_s + (ks // SK)[:, None], mask=mask, other=0.0
        )
    return codes.to(tl.float32) * scale


@triton.jit
def _fused_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, M, N, K, stride_xm, stride_w, stride_s, stride_os,
    stride_om, k_per_split,
    FORMAT: tl.constexpr, GROUP: tl.constexpr, SN: tl.constexpr, SK: tl.constexpr,
    TILE_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """out[split] = x[:, split's inputs] @ W^T[split's inputs]; one split writes the output."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    row_ok = rows < M
    col_ok = cols < N
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :],
            mask=row_ok[:, None] & (ks < k_end)[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        w = _weight_tile(w_ptr, s_ptr, z_ptr, k0, k_end, tl.program_id(1) * BLOCK_N, cols, col_ok,
                         stride_w, stride_s,
                         FORMAT, GROUP, SN, SK, TILE_N, BLOCK_K, BLOCK_N)  # fmt: skip
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision=PRECISION)
    dst = out_ptr + split.to(tl.int64) * stride_os + rows[:, None].to(tl.int64) * stride_om
    tl.store(
        dst + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


@triton.jit
def _dequant_kernel(
    w_ptr, s_ptr, z_ptr, out_ptr, N, K, stride_w, stride_s, stride_ok, stride_on,
    FORMAT: tl.constexpr, GROUP: tl.constexpr, SN: tl.constexpr, SK: tl.constexpr,
    TILE_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out[k, n] (strides ``stride_ok``, ``stride_on``) = W^T[k, n] in out's dtype."""
    k0 = tl.program_id(0) * BLOCK_K
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = _weight_tile(w_ptr, s_ptr, z_ptr, k0, K, tl.program_id(1) * BLOCK_N, cols, col_ok,
                     stride_w, stride_s, FORMAT,
                     GROUP, SN, SK, TILE_N, BLOCK_K, BLOCK_N)  # fmt: skip
    ks = k0 + tl.arange(0, BLOCK_K)
    dst = out_ptr + ks[:, None].to(tl.int64) * stride_ok + cols[None, :].to(tl.int64) * stride_on
    tl.store(dst, w.to(out_ptr.dtype.element_ty), mask=(ks < K)[:, None] & col_ok[None, :])


def plan_fused(
    m: int, n: int, k: int, fmt: int, dtype: torch.dtype, device: torch.device
) -> FusedConfig:
    """The fused kernel's tiles, from ``bench.weight_only_gemm --sweep`` on an H200 (bf16
    activations, decode rows: a row tile of 16):
    - int4: 128 outputs by 128 inputs, inputs split (a power of two) until the programs
      fill the GPU four times over, each split keeping four input tiles; three stages;
    - fp8: 256 inputs, 64 outputs (32 when that leaves fewer programs than SMs), no split,
      three stages.
    Wider row tiles, and fp32 activations (three stages need more shared memory than an
    H200 has), keep 64 by 128 with two stages and the split rule."""
    block_n, block_k, stages = 64, 128, 2
    sms = sm_count(device)
    small = pow2(m, 16) == 16 and dtype != torch.float32
    if small and fmt == FP8:
        block_n = 64 if triton.cdiv(n, 64) >= sms else 32
        block_k, stages = 256, 3
    elif small:
        block_n, stages = 128, 3
    block_n, block_k = min(block_n, pow2(n, 16)), min(block_k, pow2(k, 16))
    splits = 1
    if not (small and fmt == FP8):
        programs = triton.cdiv(m, min(64, pow2(m, 16))) * triton.cdiv(n, block_n)
        wanted = pow2(triton.cdiv(4 * sms, programs))
        splits = max(1, min(wanted, k // (4 * block_k), 16))
    return FusedConfig(block_n, block_k, splits, stages)


def weight_only_linear(
    x: torch.Tensor,
    n: int,
    fmt: int,
    weight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None = None,
    group: int = 1,
    tile: tuple[int, int] = (1, 1),
    fused: FusedConfig | None = None,
    dequant: bool | None = None,
) -> torch.Tensor:
    """x [M, K] (unit last stride) @ W.T -> [M, n] in x's dtype, W as ``fmt`` describes.

    ``dequant`` picks the path (default: by ``DEQUANT_ROWS``), ``fused`` the fused kernel's
    tiles (default: ``plan_fused``); both are for the benchmark and the tests."""
    m, k = x.shape
    zeros = scales if zeros is None else zeros
    if m == 0:
        return torch.empty(m, n, dtype=x.dtype, device=x.device)
    if dequant if dequant is not None else m >= DEQUANT_ROWS:
        return x @ dequantize(n, k, fmt, weight, scales, zeros, group, tile, x.dtype)
    cfg = fused or plan_fused(m, n, k, fmt, x.dtype, x.device)
    bm = min(64, pow2(m, 16))
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.splits), cfg.block_k) * cfg.block_k
    splits = triton.cdiv(k, k_per_split)
    shape, dtype = ((splits, m, n), torch.float32) if splits > 1 else ((1, m, n), x.dtype)
    out = torch.empty(shape, dtype=dtype, device=x.device)
    tile_n, block_n = _columns(fmt, weight, cfg.block_n)
    _fused_kernel[(triton.cdiv(m, bm), triton.cdiv(n, block_n), splits)](
        x, weight, scales, zeros, out, m, n, k, x.stride(0), weight.stride(0), scales.stride(0),
        out.stride(0), out.stride(1), k_per_split,
        FORMAT=fmt, GROUP=group, SN=tile[0], SK=tile[1], TILE_N=tile_n, BLOCK_M=bm,
        BLOCK_N=block_n, BLOCK_K=cfg.block_k, PRECISION=dot_precision(x.dtype), num_warps=4,
        num_stages=cfg.stages,
    )  # fmt: skip
    return out[0] if splits == 1 else sum_splits(out, x.dtype)


def dequantize(
    n: int,
    k: int,
    fmt: int,
    weight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group: int,
    tile: tuple[int, int],
    dtype: torch.dtype,
) -> torch.Tensor:
    """W^T [K, N] in ``dtype``: a transposed view for fp8, whose codes are [N, K]."""
    if fmt == INT4:
        out = torch.empty(k, n, dtype=dtype, device=weight.device)
        strides, result = (n, 1), out
    else:
        out = torch.empty(n, k, dtype=dtype, device=weight.device)
        strides, result = (1, k), out.t()
    block_k = min(128 if fmt == INT4 else 64, pow2(k, 16))  # int4: whole blocks of codes
    tile_n, block_n = _columns(fmt, weight, min(64, pow2(n, 16)))
    _dequant_kernel[(triton.cdiv(k, block_k), triton.cdiv(n, block_n))](
        weight, scales, zeros, out, n, k, weight.stride(0), scales.stride(0), *strides,
        FORMAT=fmt, GROUP=group, SN=tile[0], SK=tile[1], TILE_N=tile_n, BLOCK_K=block_k,
        BLOCK_N=block_n, num_warps=4, num_stages=2,
    )  # fmt: skip
    return result


def _columns(fmt: int, weight: torch.Tensor, block_n: int) -> tuple[int, int]:
    """(TILE_N, BLOCK_N): int4's prepacked words [tiles, in' / 8, tile_n] keep a program's
    columns inside one tile, so it reads whole rows of words; fp8 has no tiles (1)."""
    if fmt != INT4:
        return 1, block_n
    return weight.shape[2], min(block_n, weight.shape[2])
