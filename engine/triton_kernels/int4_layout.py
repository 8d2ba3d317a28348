"""The int4 weight's one resident layout on CUDA, prepacked at load for the decode kernel.

Codes are packed eight to an int32 in the order the decode kernel (``w4a16_decode``) consumes
them. The outputs are cut into column tiles of ``tile_n`` (128, or less for a narrow matrix),
the inputs into blocks of ``KBLOCK`` (128); the words are ``[N / tile_n, K / 8, tile_n]``:

- one column tile's words are contiguous, block after block: a program streams its
  (tile, input slice) as one run of memory, ``KBLOCK * tile_n / 2`` bytes per block;
- inside a block the inputs form eight planes of 16 (plane ``s``: inputs ``16 s .. 16 s +
  15``), each a [16, tile_n] operand of a dot with 16 contiguous activation columns. Word
  row ``8 h + r`` (h 0..1, r 0..7) of column ``c`` holds, for planes ``s = 4 h + j``, input
  ``2 r`` of plane s at bits ``4 j`` and input ``2 r + 1`` at bits ``16 + 4 j``. The two
  inputs a dot operand register holds side by side are then the two halves of one word:
  one shift and one mask-and-or give both as 16-bit float patterns (``plane_operand``).

N and K are padded to whole tiles and blocks with code 0 (the kernels mask the padded
outputs and read the padded inputs' activations as 0). The tiled kernel and the dequantizer
(``weight_only``, ``FORMAT`` INT4) read the same words element by element, so one copy serves
every row count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

KBLOCK = 128  # inputs per block: eight nibble planes of 16 (a dot's least depth)
PLANE = KBLOCK // 8  # inputs per nibble plane, word rows per block
TILE_NS = (128, 64, 32, 16)  # column tiles, widest first


def tile_n_for(n: int) -> int:
    """The widest tile that divides ``n`` (no padding), else 128 (``n`` padded to it)."""
    return next((t for t in TILE_NS if n % t == 0), 128 if n > 64 else TILE_NS[-1])


def pack_codes(codes: torch.Tensor, tile_n: int) -> torch.Tensor:
    """codes [N, K] uint8 (0..15) -> words [N' / tile_n, K' / 8, tile_n] int32 (the layout
    above; N', K' padded up to ``tile_n`` and ``KBLOCK``)."""
    if tile_n not in TILE_NS:
        raise ValueError(f"int4 tile_n {tile_n}: not one of {TILE_NS}")
    n, k = codes.shape
    padded = torch.zeros(_up(n, tile_n), _up(k, KBLOCK), dtype=torch.int32, device=codes.device)
    padded[:n, :k] = codes
    tiles, blocks = padded.shape[0] // tile_n, padded.shape[1] // KBLOCK
    # input 16 (4 h + j) + 2 r + p of a block -> word row 8 h + r, bits 4 j + 16 p
    split = padded.view(tiles, tile_n, blocks, 2, 4, PLANE // 2, 2)  # [t, c, b, h, j, r, p]
    parts = split.permute(0, 2, 3, 5, 1, 4, 6)  # [t, b, h, r, c, j, p]
    words = torch.zeros(parts.shape[:5], dtype=torch.int32, device=codes.device)
    for j in range(4):
        for p in range(2):
            words |= parts[..., j, p] << (4 * j + 16 * p)
    return words.view(tiles, blocks * PLANE, tile_n)


def unpack_codes(words: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The inverse of ``pack_codes``: codes [n, k] uint8."""
    tiles, rows, tile_n = words.shape
    blocks = rows // PLANE
    parts = [(words >> (4 * j + 16 * p)) & 0xF for j in range(4) for p in range(2)]
    codes = torch.stack(parts, dim=-1).view(tiles, blocks, 2, PLANE // 2, tile_n, 4, 2)
    codes = codes.permute(0, 4, 1, 2, 5, 3, 6).reshape(tiles * tile_n, blocks * KBLOCK)
    return codes[:n, :k].to(torch.uint8)


def _up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@triton.jit
def tile_codes(w_ptr, k0, k_end, c0, ks, cols, mask, stride_t, TILE_N: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Codes [BLOCK_K, BLOCK_N] int32 of inputs ``ks`` (from ``k0``, before ``k_end``) and
    outputs ``cols`` (from ``c0``). Whole blocks inside one column tile load their words as
    rows and unpack them in registers (the caller masks past ``k_end``); other tiles gather
    a word per code (0 where ``mask`` is off)."""
    if BLOCK_K % 128 == 0 and TILE_N % BLOCK_N == 0:
        return _block_codes(w_ptr, k0, k_end, c0, stride_t, TILE_N, BLOCK_K, BLOCK_N)
    return _gather_codes(w_ptr, ks, cols, mask, stride_t, TILE_N)


@triton.jit
def _block_codes(w_ptr, k0, k_end, c0, stride_t, TILE_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """``tile_codes`` of whole blocks (``k0`` a multiple of 128) in one column tile."""
    rows = k0 // 8 + tl.arange(0, BLOCK_K // 8)  # word rows (block, h, r)
    tile = w_ptr + (c0 // TILE_N).to(tl.int64) * stride_t + c0 % TILE_N
    row_ok = (rows // 16) * 128 < k_end  # the block exists (padded to whole blocks)
    words = tl.load(tile + rows[:, None] * TILE_N + tl.arange(0, BLOCK_N)[None, :],
                    mask=row_ok[:, None], other=0)  # fmt: skip
    i = tl.arange(0, 8)  # (j, p): bits 4 j + 16 p
    codes = (words[:, None, :] >> ((i // 2) * 4 + (i % 2) * 16)[None, :, None]) & 0xF
    codes = tl.reshape(codes, (BLOCK_K // 128, 2, 8, 4, 2, BLOCK_N))  # b, h, r, j, p, n
    codes = tl.permute(codes, (0, 1, 3, 2, 4, 5))  # input 128 b + 64 h + 16 j + 2 r + p
    return tl.reshape(codes, (BLOCK_K, BLOCK_N))


@triton.jit
def _gather_codes(w_ptr, ks, cols, mask, stride_t, TILE_N: tl.constexpr):
    """``tile_codes`` with one word loaded per code."""
    plane = (ks % 128) // 16
    rows = (ks // 128) * 16 + (plane // 4) * 8 + (ks % 16) // 2  # the word row of each input
    shifts = (plane % 4) * 4 + (ks % 2) * 16  # its nibble
    col_off = (cols // TILE_N).to(tl.int64) * stride_t + cols % TILE_N
    words = tl.load(w_ptr + col_off[None, :] + rows[:, None] * TILE_N, mask=mask, other=0)
    return (words >> shifts[:, None]) & 0xF


@triton.jit
def plane_operand(words, j: tl.constexpr, DTYPE: tl.constexpr):
    """Nibble plane ``j`` (0..3) of [8, n] words as a [16, n] dot operand of ``DTYPE``: row
    2 r from bits 4 j of word row r, row 2 r + 1 from bits 16 + 4 j. The codes become floats
    by their bits, no int-to-float conversion: in 16 bits one mask-and-or makes both halves
    at once, bf16 ``128 + q`` or fp16 ``1024 + q`` (the caller removes ``code_offset``); fp32
    ``2^23 + q``, less 2^23 (exact)."""
    if DTYPE.primitive_bitwidth == 16:
        magic: tl.constexpr = 0x43004300 if DTYPE.is_bf16() else 0x64006400
        pair = ((words >> (4 * j)) & 0x000F000F) | magic
        even = pair.to(tl.int16).to(DTYPE, bitcast=True)
        odd = (pair >> 16).to(tl.int16).to(DTYPE, bitcast=True)
    else:
        even = _fp32_codes((words >> (4 * j)) & 0xF)
        odd = _fp32_codes((words >> (16 + 4 * j)) & 0xF)
    both = tl.permute(tl.join(even, odd), (0, 2, 1))  # [8, 2, n]
    return tl.reshape(both, (2 * words.shape[0], words.shape[1]))


@triton.jit
def _fp32_codes(codes):
    return (codes | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


def code_offset(dtype: torch.dtype) -> float:
    """What ``plane_operand`` adds to each code in ``dtype``."""
    return {torch.bfloat16: 128.0, torch.float16: 1024.0}.get(dtype, 0.0)
