"""Group-quantized weights in the two formats the kernels read, row-major while they load
and in 16-column panels once packed.

Every supported checkpoint format is repacked at load into one of two code formats, so
two kernels serve them all: unsigned 4-bit codes, or int8 codes, each group of ``group``
consecutive inputs of an output row with an fp32 scale and (optionally) an fp32 min, and
``w = code * scale + min``. For the GGUF types (engine.model.quant.gguf_blocks) the product
``code * scale`` is exact in fp32, so that one rounding gives the value ggml dequantizes,
bit for bit, whether computed as a fused multiply-add (the C kernel) or not (torch).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine import cpu_kernels
from engine.cpu_kernels import quant_int8
from engine.cpu_kernels.quant_linear import QuantLinear, amx_available

PANEL = cpu_kernels.PANEL


@dataclass(frozen=True)
class RowQuant:
    """A quantized matrix [N, K], row-major: codes [N, K] (uint8 0..15 for 4 bits, int8 for
    8), scales and mins [N, K / group] fp32 (mins None: zero)."""

    codes: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    bits: int
    group: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1]

    def rows(self, index: torch.Tensor | slice) -> RowQuant:
        """The rows ``index`` (a permutation or a slice), same format."""
        mins = None if self.mins is None else self.mins[index]
        return RowQuant(self.codes[index], self.scales[index], mins, self.bits, self.group)

    def as_format(self, bits: int, group: int, with_mins: bool) -> RowQuant:
        """The same values in a format at least as wide: 8 bits for 4, a group dividing this
        one (scales repeated), zero mins added. Exact."""
        codes = self.codes if bits == self.bits else self.codes.to(torch.int8)
        repeat = self.group // group
        scales = self.scales.repeat_interleave(repeat, dim=1)
        mins = None if self.mins is None else self.mins.repeat_interleave(repeat, dim=1)
        if with_mins and mins is None:
            mins = torch.zeros_like(scales)
        return RowQuant(codes, scales, mins, bits, group)

    def dequantize(self) -> torch.Tensor:
        """fp32 [N, K]."""
        return _dequantize(self.codes, self.scales, self.mins, self.group)


def concat_rows(parts: Sequence[RowQuant]) -> RowQuant:
    """Parts stacked row-wise in one common format (the widest codes, the smallest group)."""
    bits = max(p.bits for p in parts)
    group = math.gcd(*(p.group for p in parts))
    with_mins = any(p.mins is not None for p in parts)
    same = [p.as_format(bits, group, with_mins) for p in parts]
    mins = torch.cat([p.mins for p in same if p.mins is not None]) if with_mins else None
    codes = torch.cat([p.codes for p in same])
    return RowQuant(codes, torch.cat([p.scales for p in same]), mins, bits, group)


def _dequantize(
    codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None, group: int
) -> torch.Tensor:
    # codes: [rows, K]; scales, mins: [rows, K / group] (fp32 or fp16: read as fp32)
    w = codes.float() * scales.float().repeat_interleave(group, dim=1)
    return w if mins is None else w.add_(mins.float().repeat_interleave(group, dim=1))


class PackedMatrix:
    """A matrix [N, K] kept in a packed form that computes ``x @ W.T`` itself: the layers hold
    it in place of their weight (``engine.model.linear``)."""

    out_features: int
    in_features: int

    @property
    def nbytes(self) -> int:
        raise NotImplementedError

    def linear(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T`` for x [M, K]; with ``out`` [M, N] the product is added into it."""
        raise NotImplementedError

    def dequantize(self) -> torch.Tensor:
        """W [N, K] fp32 (codes' column order)."""
        raise NotImplementedError


class QuantWeight(PackedMatrix):
    """A quantized matrix [N, K] packed in 16-row panels for ``quant_linear.c``: codes
    [N' / 16, K, 8] uint8 (4 bits: row j of a panel in the low nibble of byte j, row j + 8
    in its high nibble) or [N' / 16, K, 16] int8, scales and mins [N' / 16, K / group, 16],
    N' = N rounded up to 16 (the padding rows are zero). With ``half_scales`` the scales and
    the mins are each kept in fp16 where that holds every value exactly (the GGUF Q4_0 / Q4_1
    / Q8_0 and AWQ / GPTQ scales; 4 bytes a group fewer to read), else fp32: the kernels widen
    them to fp32 as they read, so the results are the same bits. With ``perm`` (GPTQ's
    activation order) code column j multiplies input column ``perm[j]``: the inputs are
    gathered into the codes' order first."""

    def __init__(
        self,
        rows: RowQuant,
        device: torch.device | str = "cpu",
        perm: torch.Tensor | None = None,
        half_scales: bool = True,
    ) -> None:
        self.perm = None if perm is None else perm.to(device)
        n, k = rows.shape
        if rows.group % PANEL or k % rows.group:
            raise ValueError(f"quantized weight [{n}, {k}]: group {rows.group} does not tile K")
        self.out_features, self.in_features = n, k
        self.bits, self.group = rows.bits, rows.group
        pad = -n % PANEL
        codes = _panels(_pad(rows.codes, pad))  # [P, K, 16]
        if self.bits == 4:
            codes = (codes[..., :8] | (codes[..., 8:] << 4)).to(torch.uint8)
        self.codes = codes.contiguous().to(device)
        self.scales = _packed_params(rows.scales, pad, half_scales).to(device)
        mins = rows.mins
        self.mins = None if mins is None else _packed_params(mins, pad, half_scales).to(device)
        self.bf16_products = False  # float32_matmul_precision "medium" (allow_bf16_products)
        self.int8_kernel: quant_int8.QuantInt8Linear | None = None  # use_int8_activations

    @property
    def nbytes(self) -> int:
        parts = (self.codes, self.scales, self.mins)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def linear(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T`` for x [M, K]; with ``out`` [M, N] the product is added into it."""
        if self.perm is not None:
            x = x.index_select(1, self.perm)
        kernel = self._cpu_kernel
        if (
            kernel is not None
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and x.stride(-1) == 1
            and (out is None or out.stride(-1) == 1)
        ):
            if self.int8_kernel is not None:
                return self.int8_kernel(x, out)
            return kernel(x, out, bf16_products=self.bf16_products)
        w = self.dequantize().to(x.dtype)
        return torch.nn.functional.linear(x, w) if out is None else out.addmm_(x, w.t())

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """``silu(x @ gate.T) * (x @ up.T)`` for W = [gate; up] in one pass, where this
        weight takes bf16 products and the C kernel takes ``x`` (else None: project, then
        ``silu_mul``); the same values as those two steps."""
        kernel = self._cpu_kernel
        if not self.bf16_products or kernel is None or self.perm is not None:
            return None
        if x.device.type != "cpu" or x.dtype != torch.float32 or x.stride(-1) != 1:
            return None
        return kernel.silu_mul(x)

    def allow_bf16_products(self, allow: bool) -> bool:
        """Let products of the C kernel's AMX rows be bf16(x) times bf16(W), summed in fp32
        (``quant_amx_bf16.c``), where this build and the OS have the tiles; returns whether
        they now are. Decode rows up to ``small_rows()`` stay fp32-level either way."""
        self.bf16_products = allow and self._cpu_kernel is not None and amx_available()
        return self.bf16_products

    def use_int8_activations(self, enable: bool) -> bool:
        """Run this weight's products on integer dots, the activations
        rounded to int8 per block (``quant_int8``), where this build has the kernel; returns
        whether they now do. Off: every product exact to the fp32 conversion's kernel."""
        kernel = self._cpu_kernel
        on = enable and kernel is not None and quant_int8.isa() > 0
        self.int8_kernel = quant_int8.QuantInt8Linear(kernel) if on and kernel else None
        return self.int8_kernel is not None

    @functools.cached_property
    def _cpu_kernel(self) -> QuantLinear | None:
        """The C kernel bound to these weights, or None where it cannot take them."""
        takes = (
            self.codes.device.type == "cpu"
            and self.out_features % PANEL == 0
            and cpu_kernels.available()
        )
        return (
            QuantLinear(self.codes, self.scales, self.mins, self.bits, self.group)
            if takes
            else None
        )

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` [T] of W, dequantized: [T, K] fp32 (an embedding lookup)."""
        panel, j = ids // PANEL, ids % PANEL
        if self.bits == 4:
            byte = self.codes[panel, :, j % 8]  # [T, K]
            codes = torch.where((j >= 8)[:, None], byte >> 4, byte & 15)
        else:
            codes = self.codes[panel, :, j]
        mins = None if self.mins is None else self.mins[panel, :, j]
        return _dequantize(codes, self.scales[panel, :, j], mins, self.group)

    def dequantize(self) -> torch.Tensor:
        """W [N, K] fp32."""
        return self.rows(torch.arange(self.out_features, device=self.codes.device))


def _packed_params(t: torch.Tensor, pad: int, half: bool) -> torch.Tensor:
    """Scales or mins [N, G] fp32 as panels [N' / 16, G, 16]: fp16 where ``half`` and that is
    exact for every value, else fp32."""
    t = _panels(_pad(t.float(), pad)).contiguous()
    if half and torch.equal(t.half().float(), t):
        return t.half()
    return t


def _pad(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(rows, t.shape[1])]) if rows else t


def _panels(t: torch.Tensor) -> torch.Tensor:
    """[N, C] -> [N / 16, C, 16]: column j of panel p is row 16 p + j."""
    return t.view(t.shape[0] // PANEL, PANEL, t.shape[1]).transpose(1, 2)
