"""Speculation in the step (engine.step.hooks): guesses are proposed before the schedule
(the step then needs every token so far), verified after the sampler, and the tokens a
speculative chunk emits beyond its first are counted in its row's draws. The cost model
learns from decode steps that ran alone."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.sampling.rows import StepSampling
from engine.scheduler.plan import SchedulerOutput, StepUpdate
from engine.scheduler.request import Request
from engine.speculative import Speculator
from engine.step.batch import PersistentBatch
from engine.step.counters import EngineCounters
from engine.step.hooks import StepHook
from engine.step.result import LaunchedStep


class SpeculationHook(StepHook):
    def __init__(self, speculator: Speculator, batch: PersistentBatch) -> None:
        self.speculator = speculator
        self._batch = batch
        self._timed = False  # this step's guesses were proposed: it runs alone

    def needs_tokens(self) -> bool:
        return self.speculator.wants_tokens()

    def before_schedule(self, running: Sequence[Request]) -> None:
        self._timed = self.speculator.plan(running)

    def after_schedule(self, out: SchedulerOutput) -> None:
        plain = self._timed and all(c.num_draft for c in out.prefills)
        self.speculator.cost.step_started(out.num_tokens if plain else 0)

    def verify(
        self,
        out: SchedulerOutput,
        requests: Sequence[Request],
        logits: torch.Tensor,
        step: StepSampling,
        tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, list[int]]]:
        tokens, more = self.speculator.verify(out, logits, step, tokens)
        if more:  # a speculative row drew one token per emitted token
            extra = [len(more.get(r.request_id, ())) for r in requests]
            counts = torch.tensor(extra, dtype=torch.int64, device=step.rows.device)
            self._batch.sampling.record_more(step.rows, counts)
        return tokens, more

    def applied(self, launched: LaunchedStep, update: StepUpdate) -> int:
        appended = self.speculator.step_done(launched.more, update.more)
        for request_id in launched.more or ():
            self._batch.invalidate(request_id)  # the rejected guesses' blocks went back
        return appended

    def release(self, request_id: str) -> None:
        self.speculator.forget(request_id)

    def count(self, counters: EngineCounters) -> None:
        stats = self.speculator.stats
        counters.spec_proposed = stats.proposed
        counters.spec_accepted = stats.accepted
        counters.spec_emitted = stats.emitted
        counters.spec_chunks = stats.chunks
        counters.spec_acceptance_sum = stats.acceptance_sum
        counters.spec_acceptance_buckets = tuple(stats.acceptance)
