"""A whole step's results: the arrays `LLMEngine.step_result()` returns (`StepResult`), and
the handle of a step whose tokens are still being computed (`LaunchedStep`, waited for with
one sync in `fetch`). Per request: engine.outputs.RequestOutput."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from engine.outputs import TokenLogprob
from engine.sampling import sampler as batch_sampler
from engine.scheduler.plan import SchedulerOutput
from engine.scheduler.request import Request


@dataclass(frozen=True)
class StepResult:
    """One step as arrays: requests[i] got token_ids[i] (logprobs[i] where asked)."""

    requests: list[Request]
    token_ids: list[int]
    logprobs: list[TokenLogprob | None] | None
    more: dict[str, tuple[int, ...]] = field(default_factory=dict)  # speculative: after the first

    def only(self, keep: set[int]) -> StepResult:
        """The rows whose request's id() is in `keep`."""
        rows = [i for i, r in enumerate(self.requests) if id(r) in keep]
        logprobs = [self.logprobs[i] for i in rows] if self.logprobs is not None else None
        return StepResult(
            [self.requests[i] for i in rows],
            [self.token_ids[i] for i in rows],
            logprobs,
            {
                k: v
                for k, v in self.more.items()
                if k in {self.requests[i].request_id for i in rows}
            },
        )


EMPTY_STEP = StepResult([], [], None)


class DeferredLogprobs(NamedTuple):
    tensors: batch_sampler.LogprobTensors
    top_n: tuple[int, ...]
    positions: tuple[int, ...]

    def resolve(self, rows: int) -> list[TokenLogprob | None]:
        result: list[TokenLogprob | None] = [None] * rows
        objects = batch_sampler.token_logprobs(self.tensors, self.top_n)
        for position, lp in zip(self.positions, objects, strict=True):
            result[position] = lp
        return result


@dataclass
class LaunchedStep:
    """A step whose tokens are being computed (or already are, off the GPU)."""

    out: SchedulerOutput
    requests: list[Request]
    tokens: torch.Tensor | list[int]
    ready: torch.cuda.Event | None
    logprobs: DeferredLogprobs | list[TokenLogprob | None] | None
    more: dict[str, list[int]] | None = None  # speculative chunks' tokens after the first

    def fetch(self) -> tuple[list[int], list[TokenLogprob | None] | None]:
        if self.ready is not None:
            self.ready.synchronize()
        tokens = self.tokens if isinstance(self.tokens, list) else self.tokens.tolist()
        logprobs = self.logprobs
        if isinstance(logprobs, DeferredLogprobs):
            logprobs = logprobs.resolve(len(tokens))
        return tokens, logprobs
