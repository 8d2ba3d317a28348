"""What rank 0 sends the other ranks each step (pickled by ``broadcast_object_list``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.model.attention import AttentionMetadata, StateTensors
from engine.step.batch import StepInputs

_META_TENSORS = ("positions", "slot_mapping", "query_start_loc", "context_lens", "block_tables")


@dataclass(frozen=True)
class StepPlan:
    """A step's model inputs in host memory (a rank moves them to its own device)."""

    input_ids: torch.Tensor  # [tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [sampled] int64
    plain_decode: bool = False  # every rank replays its CUDA graph for it (StepInputs')

    @classmethod
    def of(cls, inputs: StepInputs) -> StepPlan:
        meta = inputs.meta
        if meta.states is not None:  # the slots only: each rank steps its own state pool
            empty = torch.empty(0)
            states = meta.states.on(StateTensors(empty, empty), None)
            meta = dataclasses.replace(meta, states=states)
        return cls(
            inputs.input_ids.cpu(),
            _moved(meta, "cpu"),
            inputs.logits_indices.cpu(),
            inputs.plain_decode,
        )

    def inputs(self, device: torch.device) -> StepInputs:
        return StepInputs(
            self.input_ids.to(device),
            _moved(self.meta, device),
            self.logits_indices.to(device),
            None,
            plain_decode=self.plain_decode,
        )


@dataclass(frozen=True)
class Report:
    """Every rank sends rank 0 its pipeline stage's times (``gather_object``)."""


@dataclass(frozen=True)
class RunnerCall:
    """Every rank runs ``fn(its ModelRunner, arg)`` between steps (a module-level function:
    it travels by name) and sends rank 0 the answer (``gather_object``)."""

    fn: Callable[[Any, Any], Any]
    arg: Any


@dataclass(frozen=True)
class Stop:
    """The engine closes: the ranks leave their loop and exit."""


def _moved(meta: AttentionMetadata, device: torch.device | str) -> AttentionMetadata:
    moved = {name: getattr(meta, name).to(device) for name in _META_TENSORS}
    return dataclasses.replace(meta, **moved)
