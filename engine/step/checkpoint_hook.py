"""The step's part in a hybrid model's state checkpoints (engine.kv.state_checkpoints): the
checkpoints a step wrote become readable once its tokens are back (before the scheduler
applies them, so a request pinned or finished by that step keeps its saves), and the totals
go to the engine's counters."""

from __future__ import annotations

from collections.abc import Sequence

from engine.step.counters import EngineCounters
from engine.step.hooks import StepHook
from engine.step.hybrid_states import HybridStates
from engine.step.result import LaunchedStep


class CheckpointHook(StepHook):
    def __init__(self, states: HybridStates) -> None:
        assert states.checkpoints is not None
        self.states, self.checkpoints = states, states.checkpoints

    def tokens_sampled(self, launched: LaunchedStep, token_ids: Sequence[int]) -> None:
        self.states.publish(launched.out)

    def count(self, counters: EngineCounters) -> None:
        totals = self.checkpoints.totals
        counters.state_checkpoint_saves = totals.saves
        counters.state_checkpoint_hits = totals.hits
        counters.state_checkpoint_evictions = totals.evictions
