"""Weight-only int4 GEMM (w4a16): ``x @ W.T`` with W read as 4-bit codes, dequantized in tiles.

The weight is held as ``Int4Packed``: codes packed eight to an int32 down the input dimension
(``qweight`` [in / 8, out], nibble i of word r is input row ``8 r + i``: GPTQ's layout, which
AWQ checkpoints are repacked into at load), and a scale and a zero point per (group of
``group`` input rows, output column) ([in / group, out]). The kernel
(``engine.triton_kernels.weight_only``) loads the packed words once per nibble row (the eight
rows sharing a word hit the cache), shifts the nibbles out and dequantizes ``(code - zero) *
scale`` in fp32 tile by tile. Activation-ordered checkpoints carry ``perm``: the input
columns are gathered into the codes' order before the kernel, so every group is contiguous.

Accumulation order differs from a dequantize-then-matmul by rounding only.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from engine.triton_kernels.weight_only import INT4, weight_only_linear


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


def pack_int4(w: Int4Codes, dtype: torch.dtype, device: torch.device | str) -> Int4Packed:
    """``w`` in the kernel's layout, on ``device``; the input width must be a multiple of 8."""
    out, inp = w.codes.shape
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


def w4a16_linear(x: torch.Tensor, w: Int4Packed) -> torch.Tensor:
    """x [M, in] @ W.T -> [M, out] in x's dtype."""
    if x.dim() != 2 or x.shape[1] != w.in_features:
        raise ValueError(
            f"w4a16_linear: x {tuple(x.shape)} does not fit a weight of {w.in_features} inputs"
        )
    if w.perm is not None:
        x = x.index_select(1, w.perm)
    x = x if x.stride(-1) == 1 else x.contiguous()
    return weight_only_linear(x, w.out_features, INT4, w.qweight, w.scales, w.zeros, w.group)
