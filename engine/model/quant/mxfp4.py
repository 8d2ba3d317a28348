"""MXFP4 expert weights (gpt-oss): 4-bit e2m1 values in blocks of 32 along a row, each block
scaled by a power of two (an e8m0 byte, bias 127).

A checkpoint stores an expert tensor ``W`` [experts, rows, cols] as ``*_blocks`` uint8
[experts, rows, cols / 32, 16] (two values a byte, the low nibble first) and ``*_scales``
uint8 [experts, rows, cols / 32]. ``Mxfp4Experts`` keeps them packed and hands out one
expert's matrix dequantized when the expert runs; ``quantize`` writes such tensors (tests,
benchmarks).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.cpu_kernels.mxfp4 import Mxfp4Tensors

BLOCK = 32  # values a scale covers
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
SCALE_BIAS = 127


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """blocks [..., groups, 16] uint8, scales [..., groups] uint8 -> [..., groups * 32]."""
    lut = torch.tensor(E2M1, dtype=torch.float32, device=blocks.device)
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).flatten(-2).long()
    exponents = scales.to(torch.int32).sub_(SCALE_BIAS).unsqueeze(-1)  # [..., groups, 1]
    return torch.ldexp(lut[codes], exponents).flatten(-2).to(dtype)


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., cols] (cols a multiple of 32) -> (blocks, scales): each block's scale the
    smallest power of two that brings its largest value within 6, values rounded to the
    nearest e2m1 code."""
    if w.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 rows must be a multiple of {BLOCK} values, got {w.shape[-1]}")
    groups = w.float().unflatten(-1, (-1, BLOCK))  # [..., groups, 32]
    amax = groups.abs().amax(dim=-1).clamp_min(2.0**-126)
    exponents = torch.ceil(torch.log2(amax / 6.0)).clamp(-SCALE_BIAS, 127)  # [..., groups]
    scaled = groups / torch.exp2(exponents).unsqueeze(-1)
    lut = torch.tensor(E2M1[:8], dtype=torch.float32, device=w.device)
    codes = (scaled.abs().unsqueeze(-1) - lut).abs().argmin(dim=-1)  # [..., groups, 32]
    codes = codes + 8 * ((scaled < 0) & (codes > 0))
    pairs = codes.to(torch.uint8).unflatten(-1, (-1, 2))
    blocks = pairs[..., 0] | (pairs[..., 1] << 4)
    return blocks, (exponents + SCALE_BIAS).to(torch.uint8)


class Mxfp4Experts(nn.Module):
    """Packed MXFP4 weights of ``experts`` matrices [rows, cols]; ``[e]`` is expert e's
    matrix dequantized to ``dtype``."""

    def __init__(
        self, experts: int, rows: int, cols: int, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        super().__init__()
        if cols % BLOCK:
            raise ValueError(f"MXFP4 experts need a multiple of {BLOCK} columns, got {cols}")
        groups, u8 = cols // BLOCK, torch.uint8
        self.blocks = nn.Parameter(
            torch.empty(experts, rows, groups, BLOCK // 2, dtype=u8, device=device),
            requires_grad=False,
        )
        self.scales = nn.Parameter(
            torch.empty(experts, rows, groups, dtype=u8, device=device), requires_grad=False
        )
        self.shape = torch.Size((experts, rows, cols))
        self.dtype = dtype

    def __getitem__(self, expert: int) -> torch.Tensor:
        return dequantize(self.blocks[expert], self.scales[expert], self.dtype)

    @property
    def packed(self) -> Mxfp4Tensors:
        """The codes and scales as the kernels take them (engine.cpu_kernels.mxfp4)."""
        return Mxfp4Tensors(self.blocks.data, self.scales.data)

    @property
    def nbytes(self) -> int:
        return self.blocks.numel() + self.scales.numel()

    def init_random(self, gen: torch.Generator) -> None:
        """Seeded codes and scales of values ~ N(0, 1 / cols) (random-weight models), made
        one expert at a time on the weights' device."""
        rows, cols = self.shape[1:]
        for e in range(self.shape[0]):
            w = torch.randn(rows, cols, generator=gen, device=self.blocks.device)
            self.blocks.data[e], self.scales.data[e] = quantize(w.mul_(cols**-0.5))

    def targets(self, name: str) -> dict[str, torch.Tensor]:
        """The checkpoint's ``name_blocks`` and ``name_scales`` -> the packed tensors."""
        return {f"{name}_blocks": self.blocks.data, f"{name}_scales": self.scales.data}
