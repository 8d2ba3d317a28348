"""The Triton multi-LoRA shrink and expand (run by the interpreter without a GPU) equal a
token-by-token computation, adapters and base rows mixed, fused sub-matrices."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, DTYPES, tolerance
from lora_cases import LAYOUTS, SLOT_CASES, make_case, reference

pytest.importorskip("triton")

from engine.triton_kernels.lora import lora_expand_add_, lora_shrink


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("slots", ["mixed", "all_base", "single_token"])
def test_triton_delta_equals_token_by_token(layout: str, slots: str, dtype: torch.dtype) -> None:
    case = make_case(layout, SLOT_CASES[slots], dtype, str(DEVICE))
    out = case.out.clone()
    y = lora_shrink(case.x, case.a, case.token_slots)
    lora_expand_add_(out, y, case.b, case.token_slots, case.ends)
    want = reference(case).to(dtype)
    torch.testing.assert_close(out, want, **tolerance(dtype))
