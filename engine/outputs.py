"""What the engine hands back: each request's part of a step (``RequestOutput``, from
``LLMEngine.step()``) and, offline, each finished prompt (``GenerationOutput``).

A step's tokens pass four levels, one type each: the whole step while it computes
(``engine.step.result.LaunchedStep``), the whole step as arrays (``StepResult``, from
``LLMEngine.step_result()``), one request's part of it (``RequestOutput``), and that part as
the request's stream delivers it (``engine.loop.stream.StreamOutput``: with the blocks a
prefill pins and when the request was first scheduled). A node sends it on as
``cluster.protocol.TokenEvent``."""

from __future__ import annotations

from dataclasses import dataclass

from engine.scheduler.request import FinishReason, Request, RequestStatus


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of a sampled token and, when asked, the top-n alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class RequestOutput:
    """One request's part of one engine step: its new token (a speculative chunk's accepted
    tokens after it), whether it finished, and its counts."""

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


def request_output(
    request: Request, tokens: tuple[int, ...], logprob: TokenLogprob | None
) -> RequestOutput:
    """A request's part of a step: its new `tokens` and `logprob`, and whether it finished
    (a prefill's pinned request has, with PREFILLED)."""
    done = request.status in (RequestStatus.FINISHED, RequestStatus.PINNED)
    reason = request.finish_reason
    if request.status is RequestStatus.PINNED:
        reason = FinishReason.PREFILLED
    return RequestOutput(
        request_id=request.request_id,
        new_token_ids=tokens,
        logprobs=(logprob,) if logprob is not None else (),
        finished=done,
        finish_reason=reason,
        num_prompt_tokens=request.num_prompt_tokens,
        num_cached_tokens=request.num_cached_tokens,
    )
