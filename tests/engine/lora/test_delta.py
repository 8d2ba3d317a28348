"""The torch path of the LoRA delta (the reference the C and Triton kernels are held to)
against a token-by-token computation, and the hook's choice of what to skip."""

from __future__ import annotations

import pytest
import torch
from lora_cases import LAYOUTS, SLOT_CASES, make_case, reference

from engine.lora.delta import LoraBatch, PackedLora, StepLora, torch_expand_add_, torch_shrink
from engine.lora.slots import MatrixLayout, MatrixSlots


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("slots", list(SLOT_CASES))
def test_torch_delta_equals_token_by_token(layout: str, slots: str) -> None:
    case = make_case(layout, SLOT_CASES[slots])
    distinct = sorted({s for s in SLOT_CASES[slots] if s >= 0})
    out = case.out.clone()
    y = torch_shrink(case.x, case.a, case.token_slots, distinct)
    torch_expand_add_(out, y, case.b, case.token_slots, case.ends, distinct)
    torch.testing.assert_close(out.double(), reference(case), atol=1e-4, rtol=1e-4)


def _matrix(targeted: list[bool]) -> MatrixSlots:
    matrix = MatrixSlots(
        MatrixLayout(("o_proj",), (8,), 8), 2, 8, torch.float32, torch.device("cpu")
    )
    matrix.b.fill_(1.0)
    matrix.a.fill_(1.0)
    matrix.targeted = targeted
    return matrix


def test_hook_adds_only_for_steps_whose_adapters_target_the_matrix() -> None:
    step = StepLora("torch")
    hook = PackedLora({"o_proj": _matrix([False, True])}, step)
    x, out = torch.ones(2, 8), torch.zeros(2, 8)
    hook.add_(out, x, "o_proj")  # no batch bound: the base model
    assert out.abs().sum() == 0
    step.batch = LoraBatch(torch.tensor([0, -1]), (0,))  # slot 0 leaves o_proj out
    hook.add_(out, x, "o_proj")
    hook.add_(out, x, "qkv")  # a matrix the hook has no slots for
    assert out.abs().sum() == 0
    step.batch = LoraBatch(torch.tensor([-1, 1]), (1,))
    hook.add_(out, x, "o_proj")
    assert out[0].abs().sum() == 0
    torch.testing.assert_close(out[1], torch.full((8,), 64.0))  # 8 * (8 * 1)


def test_step_rejects_an_unknown_kernel() -> None:
    with pytest.raises(ValueError, match="LoRA kernel must be one of"):
        StepLora("cuda-graphs")
