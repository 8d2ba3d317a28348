"""What rank 0 sends the other ranks each step: the inputs, and whether the step is a plain
decode (every rank then replays its own CUDA graph for it, engine.step.graphs)."""

from __future__ import annotations

import pytest
import torch

from engine.model.attention import AttentionMetadata
from engine.parallel.messages import StepPlan
from engine.step.batch import StepInputs


@pytest.mark.parametrize("plain", [True, False])
def test_a_step_plan_carries_the_plain_decode_mark(plain: bool) -> None:
    meta = AttentionMetadata.build([1, 1], [3, 5], [[0], [1, 2]], 4)
    inputs = StepInputs(torch.tensor([7, 8]), meta, torch.arange(2), None, plain_decode=plain)
    got = StepPlan.of(inputs).inputs(torch.device("cpu"))
    assert got.plain_decode is plain
    assert torch.equal(got.input_ids, inputs.input_ids)
    assert torch.equal(got.meta.slot_mapping, meta.slot_mapping)
