"""The int4 decode GEMM: ``x @ W.T`` for a few rows (decode steps), bound by reading W.

It reads the prepacked words of ``engine.triton_kernels.int4_layout``. A program owns one
column tile (``tile_n`` outputs) and a slice of the input blocks; per block it loads the
tile's [16, tile_n] words, one contiguous run (16-byte asynchronous copies, pipelined), and
for each of the eight nibble planes shifts and masks the words into a [16, tile_n] operand
of codes in the activation dtype by their bits (``plane_operand``: two codes a mask-and-or,
no int-to-float conversion), and dots it with 16 contiguous activation columns. The dot runs
on the raw codes (plus ``code_offset``); a scale and a zero point apply once per group:
``acc += (x.q - (z + offset) sum(x)) s``. Accumulation is fp32. On sm_90 the inner loop
compiles to about 400 instructions per block a thread (128 codes; ``gpu_lowering.py``
compiles it), so the issue rate allows roughly 8 KB per 400 cycles per SM.

When the column tiles are too few to fill the GPU, the input blocks are split across
programs; each split writes its fp32 partial sums to a [splits, M, N] workspace and a second
kernel adds them in split order (no atomics: the same inputs give the same bits). Groups must
be 16, 32, 64 or a multiple of 128 (``decode_group_ok``); others take the tiled kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from engine.triton_kernels.int4_layout import KBLOCK, PLANE, code_offset, plane_operand
from engine.triton_kernels.layout import dot_precision, pow2, sm_count, sum_splits

# The split plan's assumptions, to be confirmed by the sweep on a device. The kernel takes 71
# registers a thread and 25 KB of shared memory at four warps (sm_90), so about seven
# programs fit an SM; four keep four 16 KB pipelines of words in flight on each.
PROGRAMS_PER_SM = 4
MIN_BLOCKS_PER_SPLIT = 2  # a split streams at least this many input blocks
MAX_SPLITS = 16
WORKSPACE_SHARE = 0.25  # the fp32 partial sums, at most this share of the weight's bytes


class DecodeConfig(NamedTuple):
    """Input splits, pipeline stages and warps of the decode kernel
    (``bench.weight_only_gemm --sweep`` times them)."""

    splits: int
    stages: int = 3
    warps: int = 4


def decode_group_ok(group: int) -> bool:
    """Whether a group of ``group`` inputs is whole nibble planes that tile a block."""
    return group in (16, 32, 64) or group % KBLOCK == 0


@triton.jit
def _decode_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, M, N, K, stride_xm, stride_wt, stride_s, stride_os,
    stride_om, blocks_per_split,
    GROUP: tl.constexpr, PLANES: tl.constexpr, TILE_N: tl.constexpr, BLOCK_M: tl.constexpr,
    OFFSET: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """out[split] = x[:, split's blocks] @ W^T[split's blocks, tile's columns]."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * TILE_N + tl.arange(0, TILE_N)
    split = tl.program_id(2)
    row_ok = rows < M
    col_ok = cols < N
    b_start = split * blocks_per_split
    b_end = tl.minimum(b_start + blocks_per_split, tl.cdiv(K, 128))
    w_tile = (
        w_ptr
        + tl.program_id(1).to(tl.int64) * stride_wt
        + tl.arange(0, 8)[:, None] * TILE_N
        + tl.arange(0, TILE_N)[None, :]
    )
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_xm
    acc = tl.zeros((BLOCK_M, TILE_N), dtype=tl.float32)
    for b in range(b_start, b_end):
        low = tl.load(w_tile + b * (16 * TILE_N))  # [8, TILE_N]: planes 0-3 (padded: no mask)
        high = tl.load(w_tile + b * (16 * TILE_N) + 8 * TILE_N)  # planes 4-7
        part = tl.zeros((BLOCK_M, TILE_N), dtype=tl.float32)
        xs = tl.zeros((BLOCK_M, 16), dtype=tl.float32)  # the group's activations, by column
        for s in tl.static_range(8):
            ks = b * 128 + s * 16 + tl.arange(0, 16)
            k_ok = (ks < K) | EVEN_K  # [16]; no test when K is whole blocks
            a = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            q = plane_operand(low if s < 4 else high, s % 4, a.dtype)  # [16, TILE_N]
            part = tl.dot(a, q, part, input_precision=PRECISION)
            xs += a.to(tl.float32)
            if (s + 1) % PLANES == 0:  # the group's planes are in: scale them
                # padded inputs past the last group read its parameters (their x is 0)
                g = tl.minimum((b * 128 + (s + 1 - PLANES) * 16) // GROUP, (K - 1) // GROUP)
                at = g * stride_s + cols
                scale = tl.load(s_ptr + at, mask=col_ok, other=0.0).to(tl.float32)
                zero = tl.load(z_ptr + at, mask=col_ok, other=0.0).to(tl.float32) + OFFSET
                sx = tl.sum(xs, axis=1)  # [BLOCK_M]
                acc += (part - sx[:, None] * zero[None, :]) * scale[None, :]
                part = tl.zeros((BLOCK_M, TILE_N), dtype=tl.float32)
                xs = tl.zeros((BLOCK_M, 16), dtype=tl.float32)
    dst = out_ptr + split.to(tl.int64) * stride_os + rows[:, None].to(tl.int64) * stride_om
    mask = row_ok[:, None] & col_ok[None, :]
    tl.store(dst + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


def row_tile(m: int) -> int:
    """Rows a program takes: 16 (a dot's least) up to 64."""
    return min(64, pow2(m, 16))


def plan_decode(m: int, n: int, k: int, tile_n: int, device: torch.device) -> DecodeConfig:
    """Input splits: enough programs for ``PROGRAMS_PER_SM`` on each SM (the SM count read
    from the device; 1 in the interpreter, so no split there), each split at least
    ``MIN_BLOCKS_PER_SPLIT`` blocks so its loads pipeline, the partial sums' workspace
    ([splits, m, n] fp32, written and read once) within ``WORKSPACE_SHARE`` of the weight's
    bytes, and at most ``MAX_SPLITS``. Three stages, four warps."""
    programs = triton.cdiv(m, row_tile(m)) * triton.cdiv(n, tile_n)
    wanted = triton.cdiv(PROGRAMS_PER_SM * sm_count(device), programs)
    blocks = triton.cdiv(k, KBLOCK) // MIN_BLOCKS_PER_SPLIT
    workspace = int(WORKSPACE_SHARE * (k / 2) / (4 * m))  # splits * m * n * 4 <= share * n * k / 2
    return DecodeConfig(splits=max(1, min(wanted, blocks, workspace, MAX_SPLITS)))


def int4_decode_linear(
    x: torch.Tensor,
    words: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    n: int,
    group: int,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """x [M, K] (unit last stride) @ W.T -> [M, n] in x's dtype; W as prepacked ``words``
    [tiles, K' / 8, tile_n] with ``scales`` / ``zeros`` [groups, n] in x's dtype."""
    m, k = x.shape
    tile_n = words.shape[2]
    if not decode_group_ok(group):
        raise ValueError(f"int4 decode: group {group} is not 16, 32, 64 or a multiple of 128")
    if words.shape[1] * 8 < k or words.shape[0] * tile_n < n:
        raise ValueError(f"int4 words {tuple(words.shape)} do not cover a {n} x {k} weight")
    cfg = config or plan_decode(m, n, k, tile_n, x.device)
    blocks = triton.cdiv(k, KBLOCK)
    per_split = triton.cdiv(blocks, cfg.splits)
    splits = triton.cdiv(blocks, per_split)
    shape, dtype = ((splits, m, n), torch.float32) if splits > 1 else ((1, m, n), x.dtype)
    out = torch.empty(shape, dtype=dtype, device=x.device)
    bm = row_tile(m)
    _decode_kernel[(triton.cdiv(m, bm), words.shape[0], splits)](
        x, words, scales, zeros, out, m, n, k, x.stride(0), words.stride(0), scales.stride(0),
        out.stride(0), out.stride(1), per_split,
        GROUP=group, PLANES=min(group, KBLOCK) // PLANE, TILE_N=tile_n, BLOCK_M=bm,
        OFFSET=code_offset(x.dtype), EVEN_K=k % KBLOCK == 0, PRECISION=dot_precision(x.dtype),
        num_warps=cfg.warps, num_stages=cfg.stages,
    )  # fmt: skip
    return out[0] if splits == 1 else sum_splits(out, x.dtype)
