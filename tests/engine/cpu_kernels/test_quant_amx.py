"""The packed linear kernel on AMX tiles (quant_amx.c): fp32-level accurate against a float64
reference and the FMA path, for row counts around the 16-row tiles and the row block, K not a
multiple of the k-block, an odd number of panels, more panel pairs than a thread unpacks at a
time, strided inputs and outputs, accumulation, one and two threads; formats it does not
take go to the FMA path unchanged."""

from __future__ import annotations

import pytest
import torch

from engine.cpu_kernels.quant_linear import AMX_ROWS, quant_linear
from tests.engine.cpu_kernels.amx_helpers import relative_error, requires_amx
from tests.engine.cpu_kernels.test_quant_linear import random_weight

pytestmark = requires_amx
# (bits, group, mins, N, K): K of 96 and 160 end in a part k-block (128 inputs), N = 48 and
# 80 in a lone panel, N = 304 has 9.5 panel pairs (more than one thread's 8 at a time)
CASES = [
    (4, 32, True, 48, 96),
    (8, 32, False, 80, 160),
    (8, 32, True, 304, 576),
    (4, 64, True, 32, 192),
    (4, 128, True, 48, 384),
    (8, 256, False, 32, 512),
]
ROWS = [1, 2, 15, 16, 17, 31, 32, 33, 50, 128, 129, 300]
# fp32 sums of K terms carry errors of a few times 2^-24 times the sum of |terms| (the FMA
# path's run about 3e-7 on these shapes, the AMX kernel's about 1e-7)
TOLERANCE = 1e-6


@pytest.mark.parametrize(("bits", "group", "mins", "n", "k"), CASES)
def test_fp32_level_against_float64_and_the_fma_path(
    bits: int, group: int, mins: bool, n: int, k: int, threads: int
) -> None:
    weight = random_weight(n, k, bits, group, mins, seed=n + k)
    dense = weight.dequantize().double()
    args = (weight.codes, weight.scales, weight.mins, bits, group)
    gen = torch.Generator().manual_seed(threads)
    for m in ROWS:
        x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 4
        want, scale = x.double() @ dense.T, x.double().abs() @ dense.abs().T
        got = quant_linear(x, *args, amx_rows=1)
        fma = quant_linear(x, *args, amx_rows=0)
        assert relative_error(got, want, scale) < TOLERANCE, m
        assert relative_error(got, fma.double(), scale) < 2 * TOLERANCE, m
        assert torch.equal(quant_linear(x, *args), got if m >= AMX_ROWS else fma), m
        h = torch.randn(m, n, generator=gen)
        added = quant_linear(x, *args, out=h.clone(), amx_rows=1)
        assert relative_error(added, h.double() + want, scale + h.double().abs()) < TOLERANCE


def test_strided_rows_and_outputs(threads: int) -> None:
    weight = random_weight(64, 128, 4, 32, True, seed=3)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 200, generator=gen)[:, 30:158]  # rows 200 apart
    out = torch.zeros(40, 100)
    quant_linear(x, weight.codes, weight.scales, weight.mins, 4, 32, out=out[:, 7:71], amx_rows=1)
    dense = weight.dequantize().double()
    scale = x.double().abs() @ dense.abs().T
    assert relative_error(out[:, 7:71], x.double() @ dense.T, scale) < TOLERANCE
    assert not out[:, :7].any() and not out[:, 71:].any()


def test_each_row_is_its_own_whatever_the_batch() -> None:
    """A row's result does not depend on the rows computed with it on the tiles (tiles, row
    blocks); calls of up to small_rows() rows run the small-row kernel instead."""
    weight = random_weight(96, 160, 4, 32, True, seed=4)
    args = (weight.codes, weight.scales, weight.mins, 4, 32)
    x = torch.randn(150, 160, generator=torch.Generator().manual_seed(1))
    full = quant_linear(x, *args, amx_rows=1)
    for lo, hi in [(0, 16), (5, 40), (100, 150), (129, 134)]:
        assert torch.equal(quant_linear(x[lo:hi], *args, amx_rows=1), full[lo:hi]), (lo, hi)


def test_groups_of_16_take_the_fma_path() -> None:
    weight = random_weight(32, 96, 8, 16, True, seed=5)
    args = (weight.codes, weight.scales, weight.mins, 8, 16)
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(2))
    assert torch.equal(quant_linear(x, *args, amx_rows=1), quant_linear(x, *args, amx_rows=0))
