"""Speculative decoding: guess a decoding request's next tokens, verify them in one forward.

The engine asks the `Speculator` for guesses before it schedules a step
(`propose`): each running request that decodes gets up to k guesses in
`Request.draft_token_ids`, from prompt lookup (`ngram`) or a small draft model (`draft`).
The scheduler plans such a request as one chunk of its last token and the guesses (k + 1
tokens of budget and KV slots), the model scores all its positions, and `verify` keeps the
accepted guesses plus one token (engine.speculative.verify). The scheduler appends them up
to a stop and gives back the blocks of the rejected ones.

Requests that ask for logprobs, penalties, a logit bias or a grammar are decoded plainly.
Steps run without overlapped scheduling when speculation is on (the guesses need the tokens
so far).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from engine.config import EngineConfig
from engine.model_config import ModelConfig
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.sampling_rows import StepSampling
from engine.schedule import SchedulerOutput
from engine.speculative.cost import StepCost
from engine.speculative.draft import DraftProposer
from engine.speculative.metrics import ACCEPTANCE_BUCKETS, SpeculativeStats
from engine.speculative.ngram import NgramProposer
from engine.speculative.verify import verify


def speculates(params: SamplingParams) -> bool:
    """Whether a request with these settings may be given guesses."""
    return (
        params.logprobs is None
        and not params.has_penalties
        and not params.logit_bias
        and params.grammar is None
    )


class Speculator:
    """Proposes guesses for a step's decodes and verifies them after its forward."""

    def __init__(
        self, config: EngineConfig, model: ModelConfig | None = None, num_blocks: int = 0
    ) -> None:
        self.k = config.num_speculative_tokens
        self.method = config.speculative_method
        self.stats = SpeculativeStats()
        self._budget: dict[str, _Budget] = {}
        self.cost = StepCost()
        self.ngram = NgramProposer(self.k, config.ngram_min, config.ngram_max)
        self.draft: DraftProposer | None = None
        if self.method == "draft":
            if model is None:
                raise ValueError("the draft proposer needs the target model's config")
            self.draft = DraftProposer(config, model, num_blocks)
        elif self.method != "ngram":
            raise ValueError(f"unknown speculative method {self.method!r}")

    def propose(self, running: Iterable[Request]) -> None:
        """Set the guesses of every running request about to decode (others get none).

        How many a request gets adapts to how its latest guesses fared: twice the last
        accepted run (at least one, at most k), and after a few rejections in a row none for
        a while (doubling up to 32 steps), so that text that does not repeat costs little.
        """
        budgets, self._budget = self._budget, {}
        asks: list[tuple[Request, int]] = []
        running = list(running)
        prior = self.stats.acceptance_rate if self.stats.proposed else 0.5
        for request in running:
            ready = (
                request.status is RequestStatus.RUNNING
                and request.num_pending == 0
                and request.num_tokens - request.num_computed_tokens == 1
                and speculates(request.params)
            )
            if not ready:
                request.draft_token_ids = []
                continue
            budget = budgets.get(request.request_id) or _Budget(self.k, prior)
            self._budget[request.request_id] = budget
            if budget.pause:
                budget.pause -= 1
                request.draft_token_ids = []
                continue
            left = request.token_limit - request.num_tokens - 1
            k = min(budget.k, left)
            if self.draft is None:
                request.draft_token_ids = self.ngram.propose(request.all_token_ids, k)
                k = len(request.draft_token_ids)
            if k > 0:
                asks.append((request, k))
        # what the step can afford (engine.speculative.cost)
        gains = [self._budget[r.request_id].gains(k) for r, k in asks]
        counts = self.cost.allocate(len(running), gains)
        if self.draft is None:
            for (request, _), n in zip(asks, counts, strict=True):
                del request.draft_token_ids[n:]
            return
        self.draft.forget_except(set(self._budget))
        guesses = self.draft.propose([r for r, _ in asks], counts)
        for (request, _), tokens in zip(asks, guesses, strict=True):
            request.draft_token_ids = tokens

    def forget(self, request_id: str) -> None:
        """The request left the running batch: drop its state (and its draft KV)."""
        self._budget.pop(request_id, None)
        if self.draft is not None:
            self.draft.forget(request_id)

    def verify(
        self,
        out: SchedulerOutput,
        logits: torch.Tensor,
        step: StepSampling,
        tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, list[int]]]:
        """The step's tokens with each speculative chunk's first emitted token in its row,
        and the tokens it emits after that, by request id. logits: every scored row
        (the sampled rows, then the guesses' rows); tokens: what the sampler drew for the
        sampled rows."""
        num_sampled = tokens.shape[0]
        positions: list[int] = []
        drafts: list[list[int]] = []
        ids: list[str] = []
        position = len(out.decodes)
        for chunk in out.prefills:
            if not chunk.sample:
                continue
            if chunk.num_draft:
                positions.append(position)
                drafts.append(list(chunk.token_ids[-chunk.num_draft :]))
                ids.append(chunk.request_id)
            position += 1
        if not positions:
            return tokens, {}
        emitted = verify(logits, step, positions, drafts, num_sampled)
        tokens = tokens.clone()
        at = torch.tensor(positions, device=tokens.device)
        tokens[at] = torch.tensor([e[0] for e in emitted], device=tokens.device)
        more = {rid: e[1:] for rid, e in zip(ids, emitted, strict=True)}
        for rid, guesses, e in zip(ids, drafts, emitted, strict=True):
            self.stats.record(len(guesses), len(e) - 1, 0)
            budget = self._budget.get(rid)
            if budget is not None:
                budget.update(len(e) - 1, len(guesses), self.k)
        return tokens, more


class _Budget:
    """Guesses a request gets next (see Speculator.propose)."""

    __slots__ = ("alpha", "backoff", "k", "misses", "pause")

    def __init__(self, k: int, alpha: float) -> None:
        self.k = k
        self.alpha = alpha  # estimated chance that a guess holds (moving average)
        self.misses = 0  # verified chunks in a row with nothing accepted
        self.pause = 0  # steps left without guesses
        self.backoff = 4

    def gains(self, k: int) -> list[float]:
        """Expected extra tokens from guess 1 .. k: the chance that it and those before hold."""
        return [self.alpha ** (j + 1) for j in range(k)]

    def update(self, accepted: int, proposed: int, k_max: int) -> None:
        # accepted of proposed, cut at the first rejection: a per-guess rate a / (a + 1)
        rate = accepted / (accepted + (1 if accepted < proposed else 0) or 1)
        self.alpha = 0.6 * self.alpha + 0.4 * rate
        self.k = max(1, min(k_max, 2 * accepted))
        if accepted:
            self.misses, self.backoff = 0, 4
            return
        self.misses += 1
        if self.misses >= 2:
            self.pause, self.misses = self.backoff, 0
            self.backoff = min(32, 2 * self.backoff)


__all__ = [
    "ACCEPTANCE_BUCKETS",
    "DraftProposer",
    "NgramProposer",
    "SpeculativeStats",
    "Speculator",
    "speculates",
    "verify",
]
