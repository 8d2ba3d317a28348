"""Drives an engine through a workload the way a node does: the first requests at once, the
rest a few steps later (some hitting the prefix cache), aborts after a number of tokens."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.engine import LLMEngine
from engine.outputs import TokenLogprob
from engine.scheduler.request import FinishReason
from models.sampling_params import SamplingParams

Work = Sequence[tuple[str, list[int], SamplingParams]]


def drive(
    engine: LLMEngine,
    work: Work,
    abort_after: Mapping[str, int],
    *,
    first: int = 6,
    each_step: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run `work` to the end: tokens, finish reasons and logprobs by request id.

    The first `first` requests are added at once, the others at the fourth step; a request
    in `abort_after` is aborted once it has seen that many tokens. `each_step` runs after
    every step (a consistency check)."""
    tokens: dict[str, list[int]] = defaultdict(list)
    logprobs: dict[str, list[TokenLogprob]] = defaultdict(list)
    reasons: dict[str, FinishReason | None] = {}
    for rid, prompt, params in work[:first]:
        engine.add_request(rid, prompt, params)
    calls = 0
    while engine.has_unfinished():
        calls += 1
        assert calls < 2000, "no progress"
        if calls == 4:
            for rid, prompt, params in work[first:]:
                engine.add_request(rid, prompt, params)
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            logprobs[out.request_id] += out.logprobs
            if out.finished:
                reasons[out.request_id] = out.finish_reason
            elif len(tokens[out.request_id]) >= abort_after.get(out.request_id, 1 << 30):
                assert engine.abort(out.request_id)
                reasons[out.request_id] = FinishReason.ABORT
        if each_step is not None:
            each_step()
    return {"tokens": dict(tokens), "reasons": reasons, "logprobs": dict(logprobs)}
