"""The C multi-LoRA delta (one call: shrink and expand per slot group, B rank-major) equals a
token-by-token fp64 computation, for adapters and base rows mixed in one step, fused
sub-matrices whose column ends are not vector multiples, and strided rows."""

from __future__ import annotations

import pytest
import torch
from lora_cases import LAYOUTS, SLOT_CASES, DeltaCase, make_case, reference

from engine import cpu_kernels
from engine.cpu_kernels import lora as cpu_lora

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the CPU kernels need a C compiler (cc or $CC)"
)


def _c_delta(case: DeltaCase, x: torch.Tensor, out: torch.Tensor, threads: int = 2) -> None:
    matrix = cpu_lora.CpuMatrix(case.a, case.b.transpose(1, 2).contiguous(), case.ends)
    plan = cpu_lora.CpuPlan(case.token_slots, case.a.shape[1], threads)
    cpu_lora.add_(out, x, matrix, plan)


# whole slot groups per thread (1 thread; 2 threads over 2 groups), or the rows and columns of
# every group shared (2 threads over 1 or 3 groups; 5 threads)
@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("slots", [*SLOT_CASES, "two_groups"])
def test_c_delta_equals_token_by_token(layout: str, slots: str, threads: int) -> None:
    token_slots = SLOT_CASES.get(slots) or [2, -1, 0, 0, 2, -1, 2] * 40
    case = make_case(layout, token_slots)
    out = case.out.clone()
    _c_delta(case, case.x, out, threads)
    torch.testing.assert_close(out.double(), reference(case), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_c_delta_reads_and_writes_strided_rows_and_leaves_base_rows(layout: str) -> None:
    case = make_case(layout, SLOT_CASES["mixed"])
    tokens, features = case.x.shape
    x = torch.randn(tokens, features + 16)[:, 16:]  # row stride != width
    x.copy_(case.x)
    wide_out = torch.randn(tokens, case.out.shape[1] + 8)
    out = wide_out[:, 8:]
    out.copy_(case.out)
    before = wide_out.clone()
    assert cpu_lora.supports(x, out)
    _c_delta(case, x, out)
    base = case.token_slots < 0
    assert torch.equal(wide_out[base], before[base])
    assert torch.equal(wide_out[:, :8], before[:, :8])
    torch.testing.assert_close(out.double(), reference(case), atol=1e-4, rtol=1e-4)


def test_c_delta_refuses_a_plan_with_too_little_scratch() -> None:
    case = make_case("qkv", SLOT_CASES["mixed"])
    matrix = cpu_lora.CpuMatrix(case.a, case.b.transpose(1, 2).contiguous(), case.ends)
    plan = cpu_lora.CpuPlan(case.token_slots, case.a.shape[1] - 1)
    with pytest.raises(ValueError, match="scratch"):
        cpu_lora.add_(case.out.clone(), case.x, matrix, plan)
