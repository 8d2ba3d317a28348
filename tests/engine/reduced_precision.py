"""The oracle criterion of a reduced-precision path against the exact one (vLLM's
quantization tests' rule), shared by the tests that hold a path to it:

- greedy, with top-k log-probabilities: where the two token sequences first part, each
  path's token is within the other's top-k at that position; before it, the chosen tokens'
  log-probabilities agree within a bound;
- teacher-forced: both paths score the same tokens (the prompt and the exact path's greedy
  tokens) in one pass; the chosen token's log-probability at each generated position differs
  by at most a bound, and on average by less.

A mixture of experts picks its experts by a discrete top-k: where the exact router's k-th and
(k + 1)-th experts nearly tie, any perturbation of its input (rounding, summation order)
may pick the other, and that token's output moves by much more than the arithmetic did.
``routing_ties`` finds those tokens in a teacher-forced pass, so a test can hold them apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from engine.llm import LLM
from engine.model import moe
from engine.model.attention import AttentionMetadata
from engine.model.routing import Routing
from engine.outputs import GenerationOutput


@dataclass(frozen=True)
class GreedyAgreement:
    """One prompt's greedy runs compared: where they part (None: never), and the largest
    chosen-token log-probability difference before it."""

    diverged_at: int | None
    logprob_error: float
    in_top_k: bool  # at the divergence, each token within the other path's top-k


def greedy_agreement(
    got: GenerationOutput, want: GenerationOutput, skip: frozenset[int] = frozenset()
) -> GreedyAgreement:
    """Compare two greedy runs of one prompt, each with top-k log-probabilities; the
    log-probability error leaves out the positions in ``skip``."""
    assert got.logprobs is not None and want.logprobs is not None
    pairs = zip(got.token_ids, want.token_ids, strict=True)
    step = next((s for s, (x, y) in enumerate(pairs) if x != y), None)
    same = len(got.token_ids) if step is None else step
    error = max(
        (
            abs(got.logprobs[s].logprob - want.logprobs[s].logprob)
            for s in range(same)
            if s not in skip
        ),
        default=0.0,
    )
    if step is None:
        return GreedyAgreement(None, error, True)
    top_got = {t for t, _ in got.logprobs[step].top}
    top_want = {t for t, _ in want.logprobs[step].top}
    crossed = got.token_ids[step] in top_want and want.token_ids[step] in top_got
    return GreedyAgreement(step, error, crossed)


@torch.inference_mode()
def teacher_forced_logprobs(llm: LLM, tokens: list[int]) -> torch.Tensor:
    """log p(tokens[i + 1] | tokens[: i + 1]) for every i, [len(tokens) - 1], from one
    prefill pass of the engine's model over KV blocks from 1 on (the engine must be idle:
    it overwrites them)."""
    runner = llm.engine.runner
    bs = runner.layout.block_size
    n = len(tokens)
    table = list(range(1, -(-n // bs) + 1))
    meta = AttentionMetadata.build([n], [0], [table], bs, runner.device)
    ids = torch.tensor(tokens, dtype=torch.int64, device=runner.device)
    rows = torch.arange(n - 1, device=runner.device)
    logits = runner.model(ids, meta, runner.kv_cache, rows).float()  # [n - 1, vocab]
    lp = torch.log_softmax(logits, dim=-1)
    return lp.gather(1, ids[1:, None])[:, 0].cpu()


RoutingRecord = list[tuple[torch.Tensor, torch.Tensor]]  # per MoE call: expert ids, logits


def record_routing(monkeypatch: pytest.MonkeyPatch) -> RoutingRecord:
    """Each MoE layer's routing from now on, one entry per call: the chosen experts [T, k]
    (sorted) and the router logits [T, E]."""
    record: RoutingRecord = []
    route = moe.route_with

    def spy(logits: torch.Tensor, *args: Any, **kwargs: Any) -> Routing:
        routing = route(logits, *args, **kwargs)
        record.append((routing.ids.sort(dim=1).values, logits.detach().clone()))
        return routing

    monkeypatch.setattr(moe, "route_with", spy)
    return record


def routing_ties(got: RoutingRecord, want: RoutingRecord, tie: float) -> set[int]:
    """Tokens where some layer chose other experts than ``want`` and ``want``'s router had its
    k-th and (k + 1)-th experts within ``tie`` (a near tie: any perturbation may flip it)."""
    tied: set[int] = set()
    for (ids_got, _), (ids_want, logits) in zip(got, want, strict=True):
        k = ids_want.shape[1]
        top = logits.topk(k + 1, dim=1).values  # [T, k + 1]
        near = (top[:, k - 1] - top[:, k]) < tie
        tied |= set(((ids_got != ids_want).any(dim=1) & near).nonzero().flatten().tolist())
    return tied
