"""The packed linear layer on integer dots (quant_int8.c): each activation row rounded to int8
per block (Q8_0: |a - d q| <= d / 2, |q| <= 127), and the product equals, to fp32 level, the
dequantized weights times those rounded activations, for 4- and 8-bit codes, with and without
mins, fp16 and fp32 scales, groups of 16 to 128, every row-tile tail, accumulation into
strided outputs, one and two threads. The build picks the kernel for the host: AVX-512 VNNI at
16 lanes, AVX2 at 8 (SPLITSERVE_CPU_VEC_WIDTH); a QuantWeight takes it only up to MAX_ROWS."""

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
]
TOLERANCE = 1e-6  # of the sum of |terms|


def rounded(x: torch.Tensor) -> torch.Tensor:
    """The kernel's rounding of x's rows, back in float64."""
    q, d = quant_int8.quantize_rows(x, quant_int8.block_size())
    block = quant_int8.block_size()
    blocks = q.double().view(x.shape[0], x.shape[1] // block, block)
    return (blocks * d.double()[..., None]).view(x.shape)


def test_rows_round_to_int8_per_block() -> None:
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0)) * 4
    x[1, :16] = 0.0  # an all-zero block: code 0, scale 0
    q, d = quant_int8.quantize_rows(x, quant_int8.block_size())
    assert q.abs().max() <= 127 and d[1, 0] == 0 and (q[1, :16] == 0).all()
    half_step = d.repeat_interleave(quant_int8.block_size(), dim=1) / 2
    assert ((x.double() - rounded(x)).abs() <= half_step.double() * (1 + 1e-6)).all()


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
    for m in range(10):  # every tail of the 4-row tiles, and no rows at all
        x = torch.randn(m + 3, k + 8, generator=gen)[3:, 8:] * 3  # rows k + 8 apart
        xr = rounded(x)
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


def test_a_weight_takes_the_kernel_up_to_max_rows_only() -> None:
    weight = random_weight(32, 64, 4, 32, True, seed=2)
    x = torch.randn(quant_int8.MAX_ROWS + 1, 64, generator=torch.Generator().manual_seed(3))
    exact = weight.linear(x)
    assert weight.use_int8_activations(True)
    assert torch.equal(weight.linear(x), exact)  # above MAX_ROWS: the exact kernel
    small = x[: quant_int8.MAX_ROWS]
    kernel = weight._cpu_kernel
    assert kernel is not None
    assert torch.equal(weight.linear(small), quant_int8.QuantInt8Linear(kernel)(small))
    assert not weight.use_int8_activations(False) and weight.int8_kernel is None
    assert torch.equal(weight.linear(small), exact[: quant_int8.MAX_ROWS])


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
