"""What rank 0 sends the other ranks each step: the inputs, and whether the step is a plain
decode (every rank then replays its own CUDA graph for it, engine.step.graphs)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from engine.model.attention import AttentionMetadata, LinearStates, StateTensors
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


def test_a_step_plan_carries_the_state_slots_not_the_pool() -> None:
    """A hybrid model's step names each sequence's state slot and the checkpoints its chunk
    starts from and saves; every rank steps its own pool and checkpoints (its key heads'
    share), so rank 0's tensors never travel."""
    pool = torch.zeros(4, 2, 96, 3)
    saved = StateTensors(torch.zeros(2, 2, 96, 3), torch.zeros(2, 2, 4, 16, 8))
    moves = {"loads": (None, 1), "saves": ((), ((2, 0),))}
    states = LinearStates(pool, torch.zeros(4, 2, 4, 16, 8), (2, 0), (False, True), saved, **moves)
    meta = dataclasses.replace(
        AttentionMetadata.build([1, 3], [3, 0], [[0], [1]], 4), states=states
    )
    inputs = StepInputs(torch.tensor([7, 8, 9, 10]), meta, torch.arange(2), None)
    sent = pickle.loads(pickle.dumps(StepPlan.of(inputs)))
    got = sent.inputs(torch.device("cpu")).meta.states
    assert got is not None and (got.slots, got.fresh) == ((2, 0), (False, True))
    assert (got.loads, got.saves) == (moves["loads"], moves["saves"])
    assert got.conv.numel() == got.recurrent.numel() == 0 and got.checkpoints is None
    assert inputs.meta.states is states  # rank 0's own step keeps its pool
