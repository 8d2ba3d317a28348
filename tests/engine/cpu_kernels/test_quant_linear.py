"""The quantized linear kernel computes what the fp32 kernel computes over the dequantized
weights, bit for bit (same FMAs in the same order), for decode and prefill row counts."""

from __future__ import annotations

import pytest
import torch

from engine import cpu_kernels
from engine.cpu_kernels.quant_linear import quant_linear
from engine.model.quant.weight import QuantWeight, RowQuant

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C compiler")
ROWS = [1, 2, 3, 5, 6, 7, 13, 32, 47, 48, 64, 600]


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


@pytest.mark.parametrize(
    ("bits", "group", "mins", "n", "k"),
    [
        (4, 32, True, 48, 96),
        (8, 16, False, 32, 272),
        (8, 32, True, 80, 160),
        (4, 128, True, 16, 384),
    ],
)
def test_equals_the_fp32_kernel_on_the_dequantized_weight(
    bits: int, group: int, mins: bool, n: int, k: int
) -> None:
    weight = random_weight(n, k, bits, group, mins, seed=n + k)
    dense = weight.dequantize()
    packed = cpu_kernels.pack_linear_weight(dense)
    assert packed is not None
    for m in ROWS:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        assert torch.equal(weight.linear(x), cpu_kernels.linear(x, packed)), m
        assert torch.allclose(weight.linear(x), x @ dense.T, rtol=1e-4, atol=1e-4)
        h = torch.randn(m, n)
        expected = cpu_kernels.linear(x, packed, out=h.clone())
        assert torch.equal(weight.linear(x, out=h), expected) and torch.equal(h, expected)


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
