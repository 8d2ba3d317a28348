"""The C multi-LoRA shrink and expand equal a token-by-token computation, for adapters and
base rows mixed in one step, fused sub-matrices and a strided input."""

from __future__ import annotations

import pytest
import torch
from lora_cases import LAYOUTS, SLOT_CASES, make_case, reference

from engine import cpu_kernels
from engine.cpu_kernels import lora as cpu_lora

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the CPU kernels need a C compiler (cc or $CC)"
)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("slots", list(SLOT_CASES))
def test_c_delta_equals_token_by_token(layout: str, slots: str) -> None:
    case = make_case(layout, SLOT_CASES[slots])
    out = case.out.clone()
    y = cpu_lora.shrink(case.x, case.a, case.token_slots)
    cpu_lora.expand_add_(out, y, case.b, case.token_slots, case.ends)
    torch.testing.assert_close(out.double(), reference(case), atol=1e-4, rtol=1e-4)


def test_c_shrink_reads_strided_rows_and_zeroes_base_rows() -> None:
    case = make_case("qkv", SLOT_CASES["mixed"])
    wide = torch.randn(case.x.shape[0], case.x.shape[1] + 16)
    wide[:, 16:] = case.x
    x = wide[:, 16:]  # row stride != width
    assert cpu_lora.supports(x, case.out)
    y = cpu_lora.shrink(x, case.a, case.token_slots)
    base = case.token_slots < 0
    assert y[base].abs().sum() == 0
    torch.testing.assert_close(y, cpu_lora.shrink(case.x, case.a, case.token_slots))
