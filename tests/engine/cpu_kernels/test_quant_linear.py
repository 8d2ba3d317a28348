"""The quantized linear kernel's FMA path computes what the fp32 kernel computes over the
dequantized weights, bit for bit (same FMAs in the same order), for decode and prefill row
counts; where the AMX kernel takes the larger row counts (test_quant_amx.py) the layer's
result is the fp32 kernel's within fp32 roundings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import cpu_kernels
from engine.cpu_kernels.build import WIDTH_ENV
from engine.cpu_kernels.quant_linear import quant_linear
from engine.model.quant.weight import QuantWeight, RowQuant

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C compiler")
ROWS = [1, 2, 3, 5, 6, 7, 13, 32, 47, 48, 64, 600]
# (bits, group, mins, N, K)
CASES = [
    (4, 32, True, 48, 96),
    (8, 16, False, 32, 272),
    (8, 32, True, 80, 160),
    (4, 128, True, 16, 384),
]


def random_weight(n: int, k: int, bits: int, group: int, mins: bool, seed: int) -> QuantWeight:
    """Codes of the format, scales and mins of half precision (as the GGUF types have: the
    products code * scale are exact)."""
    gen = torch.Generator().manual_seed(seed)
    low, high = (0, 16) if bits == 4 else (-128, 128)
    dtype = torch.uint8 if bits == 4 else torch.int8
    codes = torch.randint(low, high, (n, k), generator=gen).to(dtype)

    def halves() -> torch.Tensor:
        return (torch.randn(n, k // group, generator=gen) * 0.02).half().float()

    return QuantWeight(RowQuant(codes, halves(), halves() if mins else None, bits, group))


@pytest.mark.parametrize(("bits", "group", "mins", "n", "k"), CASES)
def test_equals_the_fp32_kernel_on_the_dequantized_weight(
    bits: int, group: int, mins: bool, n: int, k: int
) -> None:
    weight = random_weight(n, k, bits, group, mins, seed=n + k)
    dense = weight.dequantize()
    packed = cpu_kernels.pack_linear_weight(dense)
    assert packed is not None
    args = (weight.codes, weight.scales, weight.mins, bits, group)
    for m in ROWS:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        assert torch.equal(quant_linear(x, *args, amx_rows=0), cpu_kernels.linear(x, packed)), m
        assert torch.allclose(weight.linear(x), x @ dense.T, rtol=1e-4, atol=1e-4)
        h = torch.randn(m, n)
        expected = cpu_kernels.linear(x, packed, out=h.clone())
        added = quant_linear(x, *args, out=h.clone(), amx_rows=0)
        assert torch.equal(added, expected)
        scale = x.abs() @ dense.abs().T + h.abs()  # fp32 errors: a few 2^-24 of it
        assert weight.linear(x, out=h) is h  # in place
        assert ((h - expected).abs() <= 1e-6 * scale).all(), m


def test_strided_rows_and_outputs() -> None:
    weight = random_weight(32, 64, 4, 32, True, seed=1)
    x = torch.randn(9, 100)[:, 10:74]  # rows 100 apart
    out = torch.zeros(9, 50)
    weight.linear(x, out=out[:, 5:37])
    assert torch.allclose(out[:, 5:37], x @ weight.dequantize().T, rtol=1e-4, atol=1e-5)
    assert not out[:, :5].any() and not out[:, 37:].any()


def test_bad_shapes_are_refused() -> None:
    weight = random_weight(32, 64, 8, 32, False, seed=2)
    with pytest.raises(ValueError, match="does not fit a weight of 32x64"):
        quant_linear(torch.randn(2, 32), weight.codes, weight.scales, None, 8, 32)


OTHER_WIDTH = """
from engine import cpu_kernels
from tests.engine.cpu_kernels import test_quant_linear as t
assert cpu_kernels.vec_width() == {width}, cpu_kernels.vec_width()
for case in t.CASES:
    t.test_equals_the_fp32_kernel_on_the_dequantized_weight(*case)
print("ok")
"""


@pytest.mark.parametrize("width", [8, 16])
def test_each_vector_width_equals_the_fp32_kernel(width: int) -> None:
    """The kernels built for 8 and 16 lanes (a narrower machine runs 16 as register pairs)."""
    done = subprocess.run(
        [sys.executable, "-c", OTHER_WIDTH.format(width=width)],
        env=dict(os.environ, **{WIDTH_ENV: str(width)}),
        cwd=Path(__file__).parents[3],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
