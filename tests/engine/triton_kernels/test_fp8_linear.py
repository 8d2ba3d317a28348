"""The Triton weight-only FP8 GEMM equals a matmul with the dequantized weight for tensor,
channel and tile scales, ragged shapes and decode-to-prefill row counts."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, DTYPES, tolerance

pytest.importorskip("triton")

from engine.model.quant.fp8_checkpoint import Fp8Weight
from engine.triton_kernels.fp8_linear import fp8_linear


def _weight(out: int, inp: int, block: tuple[int, int], seed: int = 0) -> Fp8Weight:
    g = torch.Generator().manual_seed(seed)
    codes = (torch.randn(out, inp, generator=g) * 30).to(torch.float8_e4m3fn)
    scales = torch.rand(-(-out // block[0]), -(-inp // block[1]), generator=g) * 0.01 + 0.001
    return Fp8Weight(codes, scales, block)


@pytest.mark.parametrize("rows", [1, 7, 40])
@pytest.mark.parametrize("scaling", ["tensor", "channel", "tile"])
def test_fp8_linear_equals_the_dequantized_matmul(rows: int, scaling: str) -> None:
    out, inp = 48, 72
    block = {"tensor": (out, inp), "channel": (1, inp), "tile": (16, 32)}[scaling]
    w = _weight(out, inp, block, seed=rows)
    x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(5))
    want = x @ w.dequantize().t()
    on = Fp8Weight(w.codes.to(DEVICE), w.scales.to(DEVICE), w.block)
    torch.testing.assert_close(fp8_linear(x.to(DEVICE), on).cpu(), want, **tolerance(torch.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_linear_in_each_activation_dtype(dtype: torch.dtype) -> None:
    w = _weight(32, 64, (1, 64), seed=2)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(6))
    on = Fp8Weight(w.codes.to(DEVICE), w.scales.to(DEVICE), w.block)
    got = fp8_linear(x.to(DEVICE, dtype), on)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float().cpu(), x @ w.dequantize().t(), **tolerance(dtype))
