"""The packed linear layer on integer dots (quant_int8.c): each activation row rounded to int8
per block (Q8_0: |a - d q| <= d / 2, |q| <= 127), and the product equals, to fp32 level, the
dequantized weights times those rounded activations, for 4- and 8-bit codes, with and without
mins, fp16 and fp32 scales, groups of 16 to 128, every row-tile tail, accumulation into
strided outputs, one and two threads. The build picks the kernel for the host: AVX-512 VNNI at
16 lanes, AVX2 at 8 (SPLITSERVE_CPU_VEC_WIDTH); a QuantWeight takes it for every product
while int8_activations is on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import cpu_kernels
from engine.cpu_kernels import quant_int8
from engine.model.quant.weight import QuantWeight, RowQuant
from tests.engine.cpu_kernels.test_quant_linear import random_weight

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available() or quant_int8.isa() == 0, reason="no integer-dot kernel here"
)
CASES = [  # (bits, group, mins, N, K)
    (4, 32, True, 96, 160),
    (4, 128, False, 48, 384),
    (4, 16, True, 32, 272),
    (8, 32, False, 80, 160),
    (8, 16, True, 48, 96),
    (4, 32, True, 48, 1056),  # over more than one buffer of the many-row tiles
    (8, 32, True, 48, 1088),
]
TOLERANCE = 1e-6  # of the sum of |terms|


def rounded(x: torch.Tensor, group: int) -> torch.Tensor:
    """The kernel's rounding of x's rows for a weight of this group, back in float64."""
    q, d = quant_int8.quantize_rows(x, group)
    block = quant_int8.block_size(group)
    blocks = q.double().view(x.shape[0], x.shape[1] // block, block)
    return (blocks * d.double()[..., None]).view(x.shape)


def test_rows_round_to_int8_per_block() -> None:
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0)) * 4
    x[1, :32] = 0.0  # an all-zero block: code 0, scale 0
    for group in (16, 32):
        q, d = quant_int8.quantize_rows(x, group)
        assert q.abs().max() <= 127 and d[1, 0] == 0 and (q[1, :32] == 0).all()
        half_step = d.repeat_interleave(quant_int8.block_size(group), dim=1) / 2
        err = (x.double() - rounded(x, group)).abs()
        assert (err <= half_step.double() * (1 + 1e-6)).all()


@pytest.mark.parametrize(("bits", "group", "mins", "n", "k"), CASES)
def test_the_product_of_the_rounded_rows(
    bits: int, group: int, mins: bool, n: int, k: int, threads: int
) -> None:
    weight = random_weight(n, k, bits, group, mins, seed=n + k + bits)
    kernel = weight._cpu_kernel
    assert kernel is not None
    linear = quant_int8.QuantInt8Linear(kernel)
    dense = weight.dequantize().double()
    gen = torch.Generator().manual_seed(threads)
    # every tail of the 4-row tiles of both kernels (the many-row one from gemm_rows()), and
    # no rows at all
    for m in [*range(10), 13, 14, 15, 24, 37]:
        x = torch.randn(m + 3, k + 8, generator=gen)[3:, 8:] * 3  # rows k + 8 apart
        xr = rounded(x, group)
        want, scale = xr @ dense.T, xr.abs() @ dense.abs().T
        got = linear(x)
        assert ((got.double() - want).abs() <= TOLERANCE * scale).all(), m
        h = torch.randn(m, n + 5, generator=gen)
        out = h.clone()
        linear(x, out[:, 5:])
        assert torch.equal(out[:, :5], h[:, :5])
        err = (out[:, 5:].double() - h[:, 5:].double() - want).abs()
        assert (err <= TOLERANCE * (scale + h[:, 5:].double().abs())).all(), m


def test_fp32_scales_give_what_fp16_ones_do() -> None:
    weight = random_weight(48, 96, 4, 32, True, seed=5)
    wide = QuantWeight(
        RowQuant(_codes(weight), _rows(weight.scales), _rows(weight.mins), 4, 32),
        half_scales=False,
    )
    assert wide.scales.dtype == torch.float32 and weight.scales.dtype == torch.float16
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(1))
    for w in (weight, wide):
        assert w.use_int8_activations(True)
    assert torch.equal(weight.linear(x), wide.linear(x))


def test_a_weight_takes_the_kernel_at_every_row_count_while_on() -> None:
    weight = random_weight(32, 64, 4, 32, True, seed=2)
    kernel = weight._cpu_kernel
    assert kernel is not None
    int8 = quant_int8.QuantInt8Linear(kernel)
    for rows in (1, quant_int8.gemm_rows(), 300):  # decode, a batch, a prefill chunk
        x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
        exact = weight.linear(x)
        assert weight.use_int8_activations(True)
        assert torch.equal(weight.linear(x), int8(x))
        assert not weight.use_int8_activations(False) and weight.int8_kernel is None
        assert torch.equal(weight.linear(x), exact)


def test_the_build_picks_the_kernel_for_its_width() -> None:
    flags = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    if cpu_kernels.vec_width() == 8:
        assert quant_int8.isa() == 1  # AVX2, also where the machine has more
    elif "avx512_vnni" in flags:
        assert quant_int8.isa() == 2


def _codes(weight: QuantWeight) -> torch.Tensor:
    """The weight's codes back in rows [N, K] (uint8 0..15)."""
    ids = torch.arange(weight.out_features)
    panel, j = ids // 16, ids % 16
    byte = weight.codes[panel, :, j % 8]
    return torch.where((j >= 8)[:, None], byte >> 4, byte & 15)


def _rows(params: torch.Tensor | None) -> torch.Tensor:
    """Panel parameters [P, G, 16] back in rows [N, G], fp32."""
    assert params is not None
    return params.float().transpose(1, 2).reshape(-1, params.shape[1])
