"""The int4 weight's one resident layout on CUDA, prepacked at load for the decode kernel.

Codes are packed eight to an int32 in the order the decode kernel (``w4a16_decode``) consumes
them. The outputs are cut into column tiles of ``tile_n`` (128, or less for a narrow matrix),
the inputs into blocks of ``KBLOCK`` (128); the words are ``[N / tile_n, K / 8, tile_n]``:

- one column tile's words are contiguous, block after block: a program streams its
  (tile, input slice) as one run of memory, ``KBLOCK * tile_n / 2`` bytes per block;
- inside a block, word row ``r`` (0..15) of column ``c`` holds inputs ``r, 16 + r, ...,
  112 + r`` of the block in nibbles 0..7 (low bits first). Nibble ``s`` of the block's
  [16, tile_n] words is then the codes of inputs ``16 s .. 16 s + 15``: a [16, tile_n]
  operand of a dot with 16 contiguous activation columns, unpacked by one shift and mask.

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
    # [tile, c, block, s, r] -> [tile, block, r, c, s]
    planes = padded.view(tiles, tile_n, blocks, 8, PLANE).permute(0, 2, 4, 1, 3)
    words = torch.zeros(tiles, blocks, PLANE, tile_n, dtype=torch.int32, device=codes.device)
    for s in range(8):
        words |= planes[..., s] << (4 * s)  # int32 wraps: nibble 7 sets the sign bit
    return words.view(tiles, blocks * PLANE, tile_n)


def unpack_codes(words: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The inverse of ``pack_codes``: codes [n, k] uint8."""
    tiles, rows, tile_n = words.shape
    blocks = rows // PLANE
    planes = [(words >> (4 * s)) & 0xF for s in range(8)]
    codes = torch.stack(planes, dim=-1).view(tiles, blocks, PLANE, tile_n, 8)
    codes = codes.permute(0, 3, 1, 4, 2).reshape(tiles * tile_n, blocks * KBLOCK)
    return codes[:n, :k].to(torch.uint8)


def _up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@triton.jit
def gather_codes(w_ptr, ks, cols, mask, stride_t, TILE_N: tl.constexpr):
    """Codes [len(ks), len(cols)] int32 at inputs ``ks`` and outputs ``cols``, one word
    loaded per element (0 where ``mask`` is off)."""
    rows = (ks // 128) * 16 + ks % 16  # the word row of each input
    shifts = ((ks % 128) // 16) * 4  # its nibble
    col_off = (cols // TILE_N).to(tl.int64) * stride_t + cols % TILE_N
    words = tl.load(w_ptr + col_off[None, :] + rows[:, None] * TILE_N, mask=mask, other=0)
    return (words >> shifts[:, None]) & 0xF


@triton.jit
def codes_as(codes, DTYPE: tl.constexpr):
    """int32 codes (0..15) as ``DTYPE`` by their bits, no int-to-float conversion: bf16
    ``128 + q``, fp16 ``1024 + q`` (a 16-bit pattern with the code in the low mantissa bits;
    the caller removes ``code_offset(DTYPE)``), fp32 ``q`` (2^23 + q, less 2^23: exact)."""
    if tl.bfloat16 == DTYPE:
        return (codes | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
    elif tl.float16 == DTYPE:
        return (codes | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
    else:
        return (codes | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


def code_offset(dtype: torch.dtype) -> float:
    """What ``codes_as`` adds to each code in ``dtype``."""
    return {torch.bfloat16: 128.0, torch.float16: 1024.0}.get(dtype, 0.0)
