"""Grammars in the step (engine.step.hooks): the masks of the constrained rows are computed
in a worker thread while the forward runs and applied by the sampler; the sampled tokens
move each matcher on. A constrained row's mask needs its previous token: while any request
is constrained, no step is in flight."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from engine.sampling.grammar import Grammars, MaskJob
from engine.sampling.rows import StepSampling
from engine.scheduler.request import Request
from engine.step.counters import EngineCounters
from engine.step.hooks import StepHook
from engine.step.result import LaunchedStep


class GrammarHook(StepHook):
    def __init__(self, grammars: Grammars) -> None:
        self.grammars = grammars
        self._job = MaskJob(None)

    def needs_tokens(self) -> bool:
        return self.grammars.active

    def before_forward(self, requests: Sequence[Request], device: torch.device) -> None:
        self._job = self.grammars.start([r.request_id for r in requests], device)

    def sampling(self, step: StepSampling) -> StepSampling:
        masks, self._job = self._job.result(), MaskJob(None)
        return dataclasses.replace(step, grammar=masks) if masks is not None else step

    def tokens_sampled(self, launched: LaunchedStep, token_ids: Sequence[int]) -> None:
        if self.grammars.active:
            self.grammars.consume([r.request_id for r in launched.requests], token_ids)

    def release(self, request_id: str) -> None:
        self.grammars.forget(request_id)

    def count(self, counters: EngineCounters) -> None:
        counters.grammar_mask_seconds = self.grammars.mask_seconds
        counters.grammar_mask_steps = self.grammars.mask_steps
