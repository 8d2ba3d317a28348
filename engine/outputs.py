"""What the engine hands back per step and per finished request."""

from __future__ import annotations

from dataclasses import dataclass

from engine.scheduler.request import FinishReason


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of a sampled token and, when asked, the top-n alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class StepOutput:
    """One request's progress in one engine step: at most one new token."""

    request_id: str
    new_token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_cached_tokens: int


@dataclass(frozen=True)
class GenerationOutput:
    """Offline result for one prompt."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None
    logprobs: list[TokenLogprob] | None = None
