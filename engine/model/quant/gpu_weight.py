"""Quantized matrices on CUDA, computed by Triton GEMMs: int4 (AWQ / GPTQ,
``engine.triton_kernels.w4a16``: codes prepacked once at load, a decode kernel for up to
``DECODE_ROWS`` rows, the tiled kernel above) and fp8 (``engine.triton_kernels.fp8_linear``).
They stand in for the layers' weights as ``QuantWeight`` does on the CPU."""

from __future__ import annotations

import torch

from engine.model.quant.fp8_checkpoint import Fp8Weight
from engine.model.quant.int4_checkpoint import Int4Weight
from engine.model.quant.weight import PackedMatrix


def _sized(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class Int4GpuWeight(PackedMatrix):
    def __init__(self, w: Int4Weight, device: torch.device | str, dtype: torch.dtype) -> None:
        from engine.triton_kernels.w4a16 import pack_int4

        self.out_features, self.in_features = w.shape
        self.packed = pack_int4(w, dtype, device)

    @property
    def nbytes(self) -> int:
        p = self.packed
        return sum(_sized(t) for t in (p.qweight, p.scales, p.zeros, p.perm))

    def linear(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        from engine.triton_kernels.w4a16 import w4a16_linear

        y = w4a16_linear(x, self.packed)
        return y if out is None else out.add_(y)

    def dequantize(self) -> torch.Tensor:
        """W [N, K] fp32, the checkpoint's column order (the kernel applied to the identity)."""
        eye = torch.eye(
            self.in_features, dtype=self.packed.scales.dtype, device=self.packed.scales.device
        )
        return self.linear(eye).t().float()


class Fp8GpuWeight(PackedMatrix):
    def __init__(self, w: Fp8Weight, device: torch.device | str, dtype: torch.dtype) -> None:
        self.out_features, self.in_features = w.shape
        self.weight = Fp8Weight(w.codes.to(device), w.scales.to(device), w.block)

    @property
    def nbytes(self) -> int:
        return _sized(self.weight.codes) + _sized(self.weight.scales)

    def linear(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        from engine.triton_kernels.fp8_linear import fp8_linear

        y = fp8_linear(x, self.weight)
        return y if out is None else out.add_(y)

    def dequantize(self) -> torch.Tensor:
        return self.weight.dequantize()
