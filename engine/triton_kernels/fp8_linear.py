"""Weight-only FP8 GEMM: ``x @ W.T`` with W held as e4m3 codes and a scale per tile.

The weight stays as published (``Fp8Codes``, e.g. the checkpoint's ``Fp8Weight``: codes
[out, in] float8_e4m3fn, scales per
(``block[0]`` rows, ``block[1]`` columns); a tensor or channel scale is one tile wide). The
kernel (``engine.triton_kernels.weight_only``) widens a tile of codes to fp32 and multiplies it
by its tile's scale before the dot. Activations are not quantized (a weight-only kernel; vLLM's
``_scaled_mm`` path quantizes activations to fp8 as well, which changes the numbers), so the
result equals a matmul with the dequantized weight up to rounding.
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.triton_kernels.weight_only import FP8, weight_only_linear


class Fp8Codes(Protocol):
    """What the kernel reads of an fp8 weight (``engine.model.quant.fp8_checkpoint.Fp8Weight``):
    ``W[o, i] = float(codes[o, i]) * scales[o // block[0], i // block[1]]``."""

    @property
    def codes(self) -> torch.Tensor: ...  # [out, in] float8_e4m3fn

    @property
    def scales(self) -> torch.Tensor: ...  # [ceil(out / block[0]), ceil(in / block[1])]

    @property
    def block(self) -> tuple[int, int]: ...


def fp8_linear(x: torch.Tensor, w: Fp8Codes) -> torch.Tensor:
    """x [M, in] @ W.T -> [M, out] in x's dtype; ``w``'s tensors on x's device."""
    n, k = w.codes.shape
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"fp8_linear: x {tuple(x.shape)} does not fit a weight of {k} inputs")
    x = x if x.stride(-1) == 1 else x.contiguous()
    codes, scales = w.codes.contiguous(), w.scales.float().contiguous()
    return weight_only_linear(x, n, FP8, codes, scales, tile=w.block)
