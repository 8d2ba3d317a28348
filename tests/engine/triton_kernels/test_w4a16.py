"""The Triton int4 GEMM equals a matmul with the dequantized weight, for AWQ- and
GPTQ-ordered weights, odd shapes and row counts from a decode step to a prefill chunk."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, DTYPES, random_int4, tolerance

pytest.importorskip("triton")

from engine.triton_kernels.w4a16 import pack_int4, w4a16_linear


@pytest.mark.parametrize("rows", [1, 5, 37])
@pytest.mark.parametrize(("out", "inp", "group"), [(24, 64, 32), (40, 96, 32), (16, 128, 128)])
def test_w4a16_equals_the_dequantized_matmul(rows: int, out: int, inp: int, group: int) -> None:
    w = random_int4(out, inp, group, ordered=False, seed=rows)
    x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(7))
    want = x @ w.dequantize().t()
    got = w4a16_linear(x.to(DEVICE), pack_int4(w, torch.float32, DEVICE))
    torch.testing.assert_close(got.cpu(), want, **tolerance(torch.float32))


def test_activation_ordered_weight_gathers_its_inputs() -> None:
    w = random_int4(32, 64, 32, ordered=True, seed=3)
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(8))
    want = x @ w.dequantize().t()
    got = w4a16_linear(x.to(DEVICE), pack_int4(w, torch.float32, DEVICE))
    torch.testing.assert_close(got.cpu(), want, **tolerance(torch.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_w4a16_in_each_activation_dtype(dtype: torch.dtype) -> None:
    w = random_int4(32, 64, 32, ordered=False, seed=4)
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(9))
    want = x @ w.dequantize().t()
    got = w4a16_linear(x.to(DEVICE, dtype), pack_int4(w, dtype, DEVICE))
    assert got.dtype == dtype
    torch.testing.assert_close(got.float().cpu(), want, **tolerance(dtype))


def test_mismatched_input_width_is_refused() -> None:
    w = pack_int4(random_int4(16, 64, 32, ordered=False), torch.float32, DEVICE)
    with pytest.raises(ValueError, match="does not fit a weight of 64 inputs"):
        w4a16_linear(torch.zeros(2, 48, device=DEVICE), w)
