"""ggml's quantized blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) as ``RowQuant`` codes,
scales and mins.

Each type maps onto the kernels' formats so that ``code * scale + min`` is the value ggml
dequantizes, bit for bit (``scale`` a half-precision d times a small integer: exact in fp32):
- Q4_0: 4-bit codes q, scale d, min -8 d            (ggml: d (q - 8))
- Q4_1: 4-bit codes q, scale d, min m               (ggml: d q + m)
- Q4_K: 4-bit codes q, per 32: scale d sc, min -dmin m (ggml: d sc q - dmin m)
- Q5_K: 5-bit codes as int8, per 32 as Q4_K
- Q8_0: int8 codes q, scale d
- Q6_K: int8 codes q - 32, per 16: scale d sc
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.model.quant.weight import RowQuant
from models.gguf_header import TYPE_SIZES

QK_K = 256  # the K-quants' super-block


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian halves in the last axis (2 bytes each) as fp32."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """[..., width / 2] bytes -> [..., width] codes: low nibbles first, then high ones."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)[..., :width]


def _q4_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, int]:
    d = _f16(b[:, 0:2])  # [blocks, 1]
    return _nibbles(b[:, 2:18], 32), d, -8.0 * d, 4, 32


def _q4_1(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, int]:
    return _nibbles(b[:, 4:20], 32), _f16(b[:, 0:2]), _f16(b[:, 2:4]), 4, 32


def _q8_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, int]:
    return b[:, 2:34].view(np.int8), _f16(b[:, 0:2]), None, 8, 32


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: per 32 of a super-block, fp32 scale d sc and min -dmin m: [blocks, 8]."""
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    s = b[:, 4:16].reshape(-1, 3, 4)  # 12 bytes: six bits of sc and m for 8 sub-blocks
    lo, hi, mix = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([lo & 63, (mix & 15) | ((lo >> 2) & 48)], axis=-1)
    m = np.concatenate([hi & 63, (mix >> 4) | ((hi >> 2) & 48)], axis=-1)
    return d * sc.astype(np.float32), -(dmin * m.astype(np.float32))


def _q4_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, int]:
    scale, mins = _k_scales(b)
    qs = b[:, 16:144].reshape(-1, 4, 32)  # 64 codes per 32 bytes: 32 low nibbles, 32 high
    codes = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, QK_K)
    return codes, scale, mins, 4, 32


def _q5_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, int]:
    scale, mins = _k_scales(b)
    qh = b[:, 16:48]  # bit i of byte t: the fifth bit of code t of sub-block i
    qs = b[:, 48:176].reshape(-1, 4, 32)
    low = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32)
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    codes = (low | (high << 4)).reshape(-1, QK_K).view(np.int8)
    return codes, scale, mins, 8, 32


def _q6_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int, int]:
    ql = b[:, 0:128].reshape(-1, 2, 64)  # two halves of 128 codes
    qh = b[:, 128:192].reshape(-1, 2, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])
    low = np.stack([ql & 15, ql >> 4], axis=2).reshape(-1, 2, 4, 32)  # [blocks, half, 4, 32]
    high = (qh[:, :, None, :] >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3
    codes = ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8).reshape(-1, QK_K)
    return codes, d * sc, None, 8, 16


Decoder = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray | None, int, int]]
_DECODERS: dict[str, Decoder] = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q8_0": _q8_0,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}
# type name -> (bytes per block, weights per block, decoder); the sizes: ggml's (models)
BLOCKS: dict[str, tuple[int, int, Decoder]] = {
    name: (TYPE_SIZES[name][1], TYPE_SIZES[name][0], decode) for name, decode in _DECODERS.items()
}


def decode_blocks(type_name: str, raw: np.ndarray, rows: int, cols: int) -> RowQuant:
    """The blocks of a [rows, cols] tensor of ggml type ``type_name`` (raw: its bytes, any
    shape) as row-major codes, scales and mins."""
    size, per_block, decode = BLOCKS[type_name]
    if cols % per_block:
        raise ValueError(f"{type_name} rows of {cols} are not whole blocks of {per_block}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows * cols // per_block, size)
    codes, scales, mins, bits, group = decode(blocks)

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a).reshape(rows, -1))

    mins_t = None if mins is None else tensor(mins.astype(np.float32))
    return RowQuant(tensor(codes), tensor(scales.astype(np.float32)), mins_t, bits, group)
