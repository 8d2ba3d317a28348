"""The packed linear kernel's small-row path (quant_linear.c, up to small_rows() rows where
the build targets AVX-512): fp32-level accurate against a float64 reference, for 4- and 8-bit
codes with and without mins, groups of 16 to 128, panel counts that leave every tail (8, 4, 2
and 1 panels at a time), accumulation into strided outputs, one and two threads; a build
without it (8 lanes) gives the FMA path's bits."""

from __future__ import annotations

import pytest
import torch

from engine import cpu_kernels
from engine.cpu_kernels.quant_linear import exact_path, quant_linear, small_rows
from tests.engine.cpu_kernels.test_quant_linear import random_weight

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C compiler")
# (bits, group, mins, N, K): N = 240 is 15 panels (8 + 4 + 2 + 1), 48 is 3 (2 + 1)
CASES = [
    (4, 32, True, 240, 96),
    (4, 128, True, 48, 384),
    (4, 64, False, 112, 192),
    (8, 32, False, 240, 160),
    (8, 16, True, 48, 272),
]
TOLERANCE = 1e-6  # of the sum of |terms| (measured about 5e-8)


@pytest.mark.parametrize(("bits", "group", "mins", "n", "k"), CASES)
def test_fp32_level_against_float64(
    bits: int, group: int, mins: bool, n: int, k: int, threads: int
) -> None:
    weight = random_weight(n, k, bits, group, mins, seed=n + k + bits)
    dense = weight.dequantize().double()
    args = (weight.codes, weight.scales, weight.mins, bits, group)
    gen = torch.Generator().manual_seed(threads)
    for m in range(max(small_rows(), 4) + 2):  # no rows too (a step that samples nothing)
        x = torch.randn(m + 3, k + 8, generator=gen)[3:, 8:] * 3  # rows k + 8 apart
        want, scale = x.double() @ dense.T, x.double().abs() @ dense.abs().T
        got = quant_linear(x, *args)
        assert ((got.double() - want).abs() <= TOLERANCE * scale).all(), m
        h = torch.randn(m, n + 5, generator=gen)
        out = h.clone()
        quant_linear(x, *args, out=out[:, 5:])
        assert torch.equal(out[:, :5], h[:, :5])
        err = (out[:, 5:].double() - h[:, 5:].double() - want).abs()
        assert (err <= TOLERANCE * (scale + h[:, 5:].double().abs())).all(), m
        if exact_path(m):
            assert torch.equal(got, quant_linear(x, *args, amx_rows=0)), m


def test_decode_rows_take_it_where_the_build_has_avx512() -> None:
    assert small_rows() in ((0, 4) if cpu_kernels.vec_width() == 16 else (0,))
    assert not exact_path(1) or small_rows() == 0
    assert exact_path(1, amx_rows=0)
