"""Speculative decoding: guess a decoding request's next tokens, verify them in one forward.

The engine asks the `Speculator` for guesses before it schedules a step
(`propose`): each running request that decodes gets up to k guesses in
`Request.draft_token_ids`, from prompt lookup (`ngram`) or a small draft model (`draft`).
The scheduler plans such a request as one chunk of its last token and the guesses (k + 1
tokens of budget and KV slots; `guess_lookahead.GuessLookahead` is its lookahead), the
persistent batch runs its positions as decode rows (`rows.GuessRowLayout`), the model scores
them all, and `verify` keeps the accepted guesses plus one token (engine.speculative.verify).
The scheduler appends them up to a stop and gives back the blocks of the rejected ones. A
draft model's KV cache shares the target's budget (`draft.draft_kv_cache`). Without speculation
none of these plug-ins is given, and none of their code runs.

Requests that ask for logprobs, penalties, a logit bias or a grammar are decoded plainly.
A step that proposes needs every token so far, so it is not planned while another runs. Where
overlapped scheduling pays (a GPU: the engine sets `overlap`), a speculator whose last
proposals granted no guess lets the steps overlap, without guesses, for a stretch (16 steps,
doubling up to 128 while the proposal that ends each stretch grants none again).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

import torch

from engine.config import EngineConfig
from engine.model.config import ModelConfig
from engine.sampling.rows import StepSampling
from engine.scheduler.plan import SchedulerOutput
from engine.scheduler.request import Request, RequestStatus
from engine.speculative.acceptance import AcceptanceTable
from engine.speculative.cost import Backoff, StepCost
from engine.speculative.draft import DraftProposer
from engine.speculative.metrics import ACCEPTANCE_BUCKETS, SpeculativeStats
from engine.speculative.ngram import NgramProposer
from engine.speculative.verify import verify
from engine.step.model_load import LoadedModel
from models.sampling_params import SamplingParams

_RETRY_AFTER = 8  # steps without draft guesses after which a request's record is dropped
_QUIET_STEPS = 4  # proposals in a row granting no guess before steps overlap instead
_OVERLAP_STEPS = 16  # the first stretch of overlapped steps without guesses
_OVERLAP_MAX = 128  # the stretch doubles while the proposal after it grants none, up to this


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
        self,
        config: EngineConfig,
        model: ModelConfig | None = None,
        num_blocks: int = 0,
        draft: LoadedModel | None = None,  # the draft's weights, loaded before the target's plan
    ) -> None:
        self.k = config.num_speculative_tokens
        self.method = config.speculative_method
        self.stats = SpeculativeStats()
        self.table = AcceptanceTable(self.k)
        self._kinds: dict[str, Hashable] = {}  # the kind of each request's guesses this step
        self._drafted: dict[str, _DraftState] = {}
        self.cost = StepCost()
        self.overlap = False  # whether overlapped steps pay here (set by the engine)
        self._quiet = 0  # proposals in a row that granted no guess
        self._overlap_left = 0  # steps still to run overlapped, without guesses
        self._stretch = Backoff(_OVERLAP_STEPS, _OVERLAP_MAX)
        self.ngram = NgramProposer(self.k, config.ngram_min, config.ngram_max)
        self.draft: DraftProposer | None = None
        if self.method == "draft":
            if model is None:
                raise ValueError("the draft proposer needs the target model's config")
            self.draft = DraftProposer(config, model, num_blocks, draft, self.cost)
        elif self.method != "ngram":
            raise ValueError(f"unknown speculative method {self.method!r}")

    def wants_tokens(self) -> bool:
        """Whether the next step proposes guesses, and so needs every request's tokens so
        far (no step in flight). False during a stretch of overlapped steps."""
        return not self.overlap or self._overlap_left == 0

    def plan(self, running: Iterable[Request]) -> bool:
        """Before a step is scheduled: propose its guesses and return True (the step needs
        every token so far and runs alone), or, in an overlapped stretch, return False: no
        guesses (none are left from before: the stretch began after a proposal that granted
        none, and a request preempted since drops its guesses)."""
        if not self.wants_tokens():
            self._overlap_left -= 1
            return False
        self.propose(running)
        return True

    def _granted(self, any_guess: bool) -> None:
        """After a proposal: a stretch of overlapped steps follows quiet ones."""
        if any_guess:
            self._quiet = 0
            self._stretch.reset()
            return
        self._quiet += 1
        if self.overlap and self._quiet >= _QUIET_STEPS:
            self._overlap_left = self._stretch.use()
            self._quiet = _QUIET_STEPS - 1  # after the stretch one quiet proposal suffices

    def propose(self, running: Iterable[Request]) -> None:
        """Set the guesses of every running request about to decode (others get none).

        Each candidate guess gets its expected gain from the acceptance table, by the kind of
        proposal: for prompt lookup the match it continues (length, found once or often), for
        the draft model how the request's latest guesses fared. The cost model then keeps
        the guesses that raise the step's tokens per second."""
        table = self.table
        table.step += 1
        asks: list[tuple[Request, Hashable]] = []
        gains: list[list[float]] = []
        running = list(running)
        for request in running:
            request.draft_token_ids = []
            ready = (
                request.status is RequestStatus.RUNNING
                and request.num_pending == 0
                and request.num_tokens - request.num_computed_tokens == 1
                and speculates(request.params)
            )
            k = min(self.k, request.token_limit - request.num_tokens - 1)
            if not ready or k <= 0:
                continue
            kind: Hashable
            if self.draft is None:
                guesses, match = self.ngram.propose_for(
                    request.request_id, request.prompt_token_ids, request.output_token_ids, k
                )
                if not guesses:
                    continue
                request.draft_token_ids, kind, k = guesses, ("ngram", *match), len(guesses)
            else:
                state = self._drafted.setdefault(request.request_id, _DraftState())
                kind = ("draft", state.outcome)
            asks.append((request, kind))
            gains.append(table.gains(kind, k))
        behind = remaining = None
        if self.draft is not None:
            behind = [self.draft.behind(r) for r, _ in asks]
            remaining = [r.token_limit - r.num_tokens for r, _ in asks]
        counts = self.cost.allocate(len(running), gains, self.draft is not None, behind, remaining)
        self._granted(any(counts))
        self._kinds = {r.request_id: kind for (r, kind), n in zip(asks, counts, strict=True) if n}
        if self.draft is None:
            for (request, _), n in zip(asks, counts, strict=True):
                del request.draft_token_ids[n:]
            return
        for (request, _), n in zip(asks, counts, strict=True):
            self._drafted[request.request_id].skipped(n)
        self.draft.forget_except({r.request_id for r in running})
        guesses_of = self.draft.propose([r for r, _ in asks], counts)  # timed into self.cost
        for (request, _), drafted in zip(asks, guesses_of, strict=True):
            request.draft_token_ids = drafted

    def step_done(self, verified: Iterable[str] | None, more: Mapping[str, Sequence[int]]) -> int:
        """A step's tokens are applied: the cost model's sample, and the tokens emitted by
        its speculative chunks (`verified`: their request ids; `more`: the tokens each
        appended after its first). Returns how many were appended after the first."""
        self.cost.step_ended()
        if verified:
            self.stats.emitted += sum(1 + len(more.get(r, ())) for r in verified)
        return sum(map(len, more.values()))

    def forget(self, request_id: str) -> None:
        """The request left the running batch: drop its state (and its draft KV)."""
        self._drafted.pop(request_id, None)
        self.ngram.forget(request_id)
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
        emitted = verify(logits, step, positions, drafts, num_sampled, tokens)
        tokens = tokens.clone()
        at = torch.tensor(positions, device=tokens.device)
        tokens[at] = torch.tensor([e[0] for e in emitted], device=tokens.device)
        more = {rid: e[1:] for rid, e in zip(ids, emitted, strict=True)}
        for rid, guesses, e in zip(ids, drafts, emitted, strict=True):
            accepted = len(e) - 1
            self.stats.record(len(guesses), accepted, 0)
            kind = self._kinds.get(rid)
            if kind is not None:
                self.table.record(kind, len(guesses), accepted)
            state = self._drafted.get(rid)
            if state is not None:
                state.verified(accepted, len(guesses))
        return tokens, more


class _DraftState:
    """How a request's latest draft guesses fared: its kind in the acceptance table."""

    __slots__ = ("idle", "outcome")

    def __init__(self) -> None:
        self.outcome: str | None = None  # "full", "part", "none"; None: not lately
        self.idle = 0  # steps in a row without guesses

    def verified(self, accepted: int, proposed: int) -> None:
        self.idle = 0
        self.outcome = "full" if accepted == proposed else "part" if accepted else "none"

    def skipped(self, guesses: int) -> None:
        # a request kept from guessing (its kind judged poor) is tried afresh after a while
        if guesses == 0:
            self.idle += 1
            if self.idle >= _RETRY_AFTER:
                self.outcome, self.idle = None, 0


__all__ = [
    "ACCEPTANCE_BUCKETS",
    "DraftProposer",
    "NgramProposer",
    "SpeculativeStats",
    "Speculator",
    "speculates",
    "verify",
]
