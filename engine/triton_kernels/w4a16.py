"""Weight-only int4 GEMM (w4a16): ``x @ W.T`` with W read as 4-bit codes.

The weight is held as ``Int4Packed``: the codes prepacked once at load in the layout of
``engine.triton_kernels.int4_layout`` (eight to an int32, column tile by column tile, in the
order the decode kernel reads them), and a scale and a zero point per (group of ``group``
inputs, output column) ([in / group, out]). Two kernels read the one copy of the codes:
- up to ``DECODE_ROWS`` rows (decode steps): ``engine.triton_kernels.w4a16_decode``, which
  streams each column tile's words and dots the raw codes, scaling once per group;
- more rows, or a group the decode kernel cannot tile: the tiled kernel of
  ``engine.triton_kernels.weight_only`` (``FORMAT`` INT4), which dequantizes ``(code - zero) *
  scale`` tile by tile (and from 128 rows dequantizes the whole matrix for cuBLAS).
Activation-ordered checkpoints carry ``perm``: the input columns are gathered into the codes'
order before either kernel, so every group is contiguous.

Accumulation order differs from a dequantize-then-matmul by rounding only.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from engine.triton_kernels.int4_layout import pack_codes, tile_n_for, unpack_codes
from engine.triton_kernels.w4a16_decode import decode_group_ok, int4_decode_linear
from engine.triton_kernels.weight_only import INT4, weight_only_linear

# Rows up to which the decode kernel runs. The kernel is built for 1-16 rows (one 16-row dot
# tile); whether it still beats the tiled kernel at 32 or 64 rows is to be measured on a
# device (bench.weight_only_gemm), and this moved with it.
DECODE_ROWS = 16


class Int4Codes(Protocol):
    """What ``pack_int4`` reads of an unpacked int4 weight
    (``engine.model.quant.int4_checkpoint.Int4Weight``): ``W[o, perm[j]] = (codes[o, j] -
    zeros[o, j // group_size]) * scales[o, j // group_size]``."""

    @property
    def codes(self) -> torch.Tensor: ...  # [out, in] uint8, 0..15

    @property
    def scales(self) -> torch.Tensor: ...  # [out, groups] fp32

    @property
    def zeros(self) -> torch.Tensor: ...  # [out, groups] fp32, code units

    @property
    def group_size(self) -> int: ...

    @property
    def perm(self) -> torch.Tensor | None: ...  # [in] int64, None: columns in order


class Int4Packed(NamedTuple):
    """An int4 weight in the kernels' layout (see the module's docstring)."""

    qweight: torch.Tensor  # [out' / tile_n, in' / 8, tile_n] int32 (int4_layout; padded)
    scales: torch.Tensor  # [in / group, out], the activation dtype
    zeros: torch.Tensor  # [in / group, out], the activation dtype, code units
    group: int
    perm: torch.Tensor | None  # [in] int64: the input column each code row reads
    out_features: int
    in_features: int

    def unpacked_codes(self) -> torch.Tensor:
        """The codes [out, in] uint8 back from the words, as ``pack_int4`` was given them."""
        return unpack_codes(self.qweight, self.out_features, self.in_features)


def pack_int4(w: Int4Codes, dtype: torch.dtype, device: torch.device | str) -> Int4Packed:
    """``w`` in the kernels' layout, on ``device``."""
    out, inp = w.codes.shape
    return Int4Packed(
        qweight=pack_codes(w.codes, tile_n_for(out)).to(device),
        scales=w.scales.t().contiguous().to(device, dtype),
        zeros=w.zeros.t().contiguous().to(device, dtype),
        group=w.group_size,
        perm=None if w.perm is None else w.perm.to(device),
        out_features=out,
        in_features=inp,
    )


def w4a16_linear(x: torch.Tensor, w: Int4Packed) -> torch.Tensor:
    """x [M, in] @ W.T -> [M, out] in x's dtype."""
    if x.dim() != 2 or x.shape[1] != w.in_features:
        raise ValueError(
            f"w4a16_linear: x {tuple(x.shape)} does not fit a weight of {w.in_features} inputs"
        )
    if w.perm is not None:
        x = x.index_select(1, w.perm)
    x = x if x.stride(-1) == 1 else x.contiguous()
    if decodes(x.shape[0], w):
        return int4_decode_linear(x, w.qweight, w.scales, w.zeros, w.out_features, w.group)
    return weight_only_linear(x, w.out_features, INT4, w.qweight, w.scales, w.zeros, w.group)


def decodes(m: int, w: Int4Packed) -> bool:
    """Whether ``m`` rows of ``w`` take the decode kernel."""
    return 0 < m <= DECODE_ROWS and decode_group_ok(w.group)
