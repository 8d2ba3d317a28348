"""The packed linear kernel's bf16 products (quant_amx_bf16.c, float32_matmul_precision
"medium"): bf16(x) times bf16(code * scale + min) summed in fp32, against a float64 reference
of the same bf16 inputs, for row counts around the 16-row tiles and the row pairs, K of one
and many tile steps, lone panels, groups of 16 to 256, 4- and 8-bit codes with and without
mins, accumulation into strided outputs, one and two threads; decode rows keep the
fp32-level kernel, and a row's result does not depend on its batch."""

from __future__ import annotations

import pytest
import torch

from engine import cpu_kernels
from engine.cpu_kernels.quant_linear import quant_linear, small_rows
from engine.model.quant.weight import QuantWeight
from tests.engine.cpu_kernels.amx_helpers import relative_error, requires_amx
from tests.engine.cpu_kernels.test_quant_linear import random_weight

pytestmark = requires_amx
# (bits, group, mins, N, K): N = 48 and 80 end in a lone panel, K = 32 is one tile step,
# N = 304 and K = 1536 are more panel pairs than a thread dequantizes at a time
CASES = [
    (4, 32, True, 48, 96),
    (8, 32, False, 80, 160),
    (8, 32, True, 304, 576),
    (4, 16, True, 32, 64),
    (4, 128, True, 48, 384),
    (8, 256, False, 32, 512),
    (4, 32, True, 16, 32),
    (4, 32, True, 576, 1536),
]
ROWS = [5, 15, 16, 17, 31, 32, 33, 50, 129, 300]
# fp32 sums of K bf16 products: a few times 2^-24 of the sum of |terms| (measured up to 5e-7
# at K = 1536, added to an output)
TOLERANCE = 2e-6


def bf16_weight(weight: QuantWeight) -> torch.Tensor:
    """W [N, K] as the kernel rounds it: code * scale + min in one fp32 rounding (an FMA;
    in float64 then fp32), then bf16, as float64."""
    n = weight.out_features
    panel, j = torch.arange(n) // 16, torch.arange(n) % 16
    if weight.bits == 4:
        byte = weight.codes[panel, :, j % 8]
        codes = torch.where((j >= 8)[:, None], byte >> 4, byte & 15).double()
    else:
        codes = weight.codes[panel, :, j].double()
    group = torch.arange(weight.in_features) // weight.group
    w = codes * _per_k(weight.scales, j, group)
    if weight.mins is not None:
        w = w + _per_k(weight.mins, j, group)
    return w.float().bfloat16().double()


def _per_k(params: torch.Tensor, j: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """[N, K] of per-group ``params`` [P, G, 16] (row n: panel n // 16, lane n % 16)."""
    picked = params[torch.arange(j.numel()) // 16, :, j]  # [N, G]
    return picked[:, group].double()


@pytest.mark.parametrize(("bits", "group", "mins", "n", "k"), CASES)
def test_bf16_products_against_float64(
    bits: int, group: int, mins: bool, n: int, k: int, threads: int
) -> None:
    weight = random_weight(n, k, bits, group, mins, seed=n + k)
    w = bf16_weight(weight)
    exact = weight.dequantize().double()
    args = (weight.codes, weight.scales, weight.mins, bits, group)
    gen = torch.Generator().manual_seed(threads + k)
    for m in ROWS:
        x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 4
        xb = x.bfloat16().double()
        want, scale = xb @ w.T, xb.abs() @ w.abs().T
        got = quant_linear(x, *args, bf16_products=True)
        assert relative_error(got, want, scale) < TOLERANCE, m
        # not the fp32-level product: bf16 inputs are 2^-9 off, a few hundred times the above
        assert relative_error(got, x.double() @ exact.T, scale) > 10 * TOLERANCE, m
        h = torch.randn(m, n, generator=gen)
        added = quant_linear(x, *args, out=h.clone(), bf16_products=True)
        assert relative_error(added, h.double() + want, scale + h.double().abs()) < TOLERANCE


def test_strided_rows_and_outputs(threads: int) -> None:
    weight = random_weight(64, 128, 4, 32, True, seed=3)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 200, generator=gen)[:, 30:158]  # rows 200 apart
    out = torch.zeros(40, 100)
    args = (weight.codes, weight.scales, weight.mins, 4, 32)
    quant_linear(x, *args, out=out[:, 7:71], bf16_products=True)
    xb, w = x.bfloat16().double(), bf16_weight(weight)
    assert relative_error(out[:, 7:71], xb @ w.T, xb.abs() @ w.abs().T) < TOLERANCE
    assert not out[:, :7].any() and not out[:, 71:].any()


def test_each_row_is_its_own_whatever_the_batch() -> None:
    """Whole tiles sum in place and a last part tile through a buffer, in the same order: a
    row's result, added to an output or not, does not depend on the rows beside it."""
    weight = random_weight(96, 160, 4, 32, True, seed=4)
    args = (weight.codes, weight.scales, weight.mins, 4, 32)
    gen = torch.Generator().manual_seed(1)
    x, h = torch.randn(150, 160, generator=gen), torch.randn(150, 96, generator=gen)
    full = quant_linear(x, *args, bf16_products=True)
    added = quant_linear(x, *args, out=h.clone(), bf16_products=True)
    for lo, hi in [(0, 16), (5, 40), (100, 150), (129, 134), (7, 39)]:
        part = quant_linear(x[lo:hi], *args, bf16_products=True)
        assert torch.equal(part, full[lo:hi]), (lo, hi)
        part_added = quant_linear(x[lo:hi], *args, out=h[lo:hi].clone(), bf16_products=True)
        assert torch.equal(part_added, added[lo:hi]), (lo, hi)


def test_decode_rows_keep_the_fp32_level_kernel() -> None:
    weight = random_weight(64, 128, 4, 32, True, seed=6)
    args = (weight.codes, weight.scales, weight.mins, 4, 32)
    x = torch.randn(max(small_rows(), 1), 128, generator=torch.Generator().manual_seed(3))
    if small_rows() == 0:
        pytest.skip("this build has no small-row kernel: every row count takes the tiles")
    assert torch.equal(quant_linear(x, *args, bf16_products=True), quant_linear(x, *args))


def test_the_weight_takes_bf16_products_only_when_allowed() -> None:
    weight = random_weight(64, 128, 4, 32, True, seed=7)
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(4))
    fp32 = weight.linear(x)
    assert weight.allow_bf16_products(True)
    bf16 = weight.linear(x)
    assert not torch.equal(bf16, fp32)
    assert torch.equal(bf16, quant_linear(x, weight.codes, weight.scales, weight.mins, 4, 32,
                                          bf16_products=True))  # fmt: skip
    assert not weight.allow_bf16_products(False)
    assert torch.equal(weight.linear(x), fp32)


@pytest.mark.parametrize(("n", "k"), [(64, 128), (96, 160), (3072, 576)])
def test_fused_silu_mul_is_the_two_steps_bit_for_bit(n: int, k: int, threads: int) -> None:
    """gate_up's product with silu(gate) * up in its epilogue writes what the product and
    then silu_mul write (gate rows 0..n/2, up rows n/2..n, as the loader fuses them)."""
    weight = random_weight(n, k, 4, 32, True, seed=n)
    assert weight.silu_mul(torch.randn(40, k)) is None  # fp32-level weights: not fused
    weight.allow_bf16_products(True)
    gen = torch.Generator().manual_seed(n + threads)
    for m in [small_rows() + 1, 16, 17, 40, 129]:
        x = torch.randn(m, k, generator=gen)
        fused = weight.silu_mul(x)
        assert fused is not None and fused.shape == (m, n // 2)
        assert torch.equal(fused, cpu_kernels.silu_mul(weight.linear(x))), m
    if small_rows():
        assert weight.silu_mul(torch.randn(small_rows(), k)) is None  # decode rows
