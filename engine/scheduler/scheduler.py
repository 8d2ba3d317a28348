"""Continuous batching over the block manager: integers in, a SchedulerOutput out.

Each step has a token budget (max_num_batched_tokens) and a cap on live sequences
(max_num_seqs). The order is: running decodes (one token each), then the rest of running
prefills (chunked when longer than the budget left), then waiting requests in (priority,
arrival) order (lower priority first; FIFO among equals), while blocks last. A running
request that needs a block when none is free preempts the last running request in that
order, the lowest priority and newest (itself, if it is that one): its blocks are freed and
it goes back to the waiting queue at its place, to be recomputed from prompt + tokens so far.

Protocol: `schedule()`, run the chunks, `update(out, sampled)`. `schedule()` advances the
requests as if the step ran, their sampled tokens pending: with overlapped scheduling the
next `schedule()` comes before this `update()` and decodes the pending tokens; updates come
in scheduling order. A request whose pending token would end it by length is not scheduled
again; one that stops on the token itself (EOS, a stop id) finishes at its update, and the
step planned meanwhile drops its row. After a failed step, `forget_in_flight()` and abort.

Limits, decided: a request whose tokens alone need more blocks than the whole cache is
refused at `add()` with RequestTooLargeError (a ValueError). A request that grows to the
cache's capacity finishes with FinishReason.LENGTH, like one reaching the context length.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine.config import EngineConfig, Role
from engine.kv.block_manager import BlockManager
from engine.scheduler.plan import (
    ImportPlan,
    ScheduledChunk,
    SchedulerOutput,
    StepUpdate,
)
from engine.scheduler.queues import HeldImport, RequestPool
from engine.scheduler.request import FinishReason, Request, RequestStatus


@dataclass
class _Step:
    budget: int
    scheduled: dict[str, int] = field(default_factory=dict)  # request id -> tokens
    prefills: list[str] = field(default_factory=list)  # chunks other than decodes, in order
    preempted: list[str] = field(default_factory=list)
    grown: list[Request] = field(default_factory=list)  # decodes given a block
    drafts: dict[str, int] = field(default_factory=dict)  # request id -> guesses verified

    def add(self, request: Request, num_tokens: int) -> None:
        self.scheduled[request.request_id] = num_tokens
        self.budget -= num_tokens

    def drop(self, request: Request) -> None:
        self.budget += self.scheduled.pop(request.request_id, 0)
        self.preempted.append(request.request_id)


class Scheduler(RequestPool):
    """Decides which tokens of which requests run each step. Not thread-safe."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        super().__init__(config, block_manager)
        self._in_flight: deque[SchedulerOutput] = deque()  # scheduled, not yet updated

    def add_prefilled(self, request: Request, output_token_ids: Sequence[int]) -> ImportPlan | None:
        """Decode role: reserve blocks for a request whose KV is written from outside.

        output_token_ids are the tokens generated elsewhere (usually just the first); the KV
        of the prompt and all of them but the last comes from outside. None: no room now (no
        blocks, or max_num_seqs reached); nothing changed, try again later or recompute.
        The request is held, not scheduled, until `commit_prefilled` (or `abort`).
        """
        if self._config.role is not Role.DECODE:
            raise RuntimeError(f"add_prefilled needs role=decode, this is {self._config.role}")
        if not output_token_ids or request.output_token_ids:
            raise ValueError(
                f"request {request.request_id}: add_prefilled takes a request without outputs "
                "and at least one generated token"
            )
        num_tokens = request.num_tokens + len(output_token_ids)
        self._check_new(request, num_tokens)
        if len(self._running) + len(self._importing) >= self._config.max_num_seqs:
            return None
        all_tokens = request.prompt_token_ids + list(output_token_ids)
        hits = self._blocks.match_prefix(all_tokens)
        if not self._blocks.allocate(request, num_tokens, hits):
            return None
        self._enter(request)
        self._importing[request.request_id] = HeldImport(request, list(output_token_ids))
        return ImportPlan(
            block_ids=tuple(request.block_ids),
            num_cached_tokens=request.num_cached_tokens,
            num_kv_tokens=num_tokens - 1,
            block_size=self._blocks.block_size,
        )

    def commit_prefilled(self, request_id: str) -> Request | None:
        """Decode role: the KV is written; admit the request into the running batch.

        Returns it (finished already when its last generated token was a stop), or None when
        no request with that id is importing (aborted meanwhile).
        """
        held = self._importing.pop(request_id, None)
        if held is None:
            return None
        request = held.request
        request.output_token_ids.extend(held.output_token_ids)
        request.num_computed_tokens = request.num_tokens - 1
        self._start_running(request)
        self._blocks.commit_full_blocks(request)
        self._after_token(request)
        return request

    # ---- the step -----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Plan one step within the token budget and the sequence cap, and advance the
        requests as if it ran: the next `schedule()` plans the step after it."""
        step = _Step(budget=self._config.max_num_batched_tokens)
        decodes, starts = self._schedule_decodes(step)
        if len(decodes) != len(self._running):  # else every running request decodes
            self._schedule_prefills(step)
        if not step.preempted:  # no admission while short of blocks: avoids thrashing
            self._admit_waiting(step)
        else:
            kept = [
                (r, s)
                for r, s in zip(decodes, starts, strict=True)
                if r.request_id in step.scheduled
            ]
            decodes, starts = [r for r, _ in kept], [s for _, s in kept]
        requests = [self._live[rid] for rid in step.prefills if rid in step.scheduled]
        chunks = tuple(
            self._chunk(r, step.scheduled[r.request_id], step.drafts.get(r.request_id, 0))
            for r in requests
        )
        for request in decodes:
            request.num_computed_tokens += 1
            request.num_pending += 1
        for request, chunk in zip(requests, chunks, strict=True):
            request.num_computed_tokens += chunk.num_tokens - chunk.num_draft
            request.num_pending += chunk.sample
        grown = tuple(r for r in step.grown if r.request_id in step.scheduled)
        out = SchedulerOutput(
            chunks, tuple(step.preempted), tuple(decodes), tuple(starts), tuple(requests), grown
        )
        if not out.is_empty:
            self._in_flight.append(out)
        return out

    def update(
        self,
        out: SchedulerOutput,
        sampled: Mapping[str, int] | Sequence[int],
        more: Mapping[str, Sequence[int]] | None = None,
    ) -> StepUpdate:
        """Apply a computed step: append its sampled tokens, stop, finish or pin.

        Steps are updated in the order they were scheduled (with overlapped scheduling the
        next one is planned before this update). sampled: the new token of every sampled
        request, by request id or as a sequence in step order (decodes, then the sampled
        prefill chunks). Requests aborted since `schedule()` are skipped. more: for
        speculative chunks, the verified tokens after the first (appended up to a stop).
        """
        if out.is_empty:
            return StepUpdate(())
        if not self._in_flight or self._in_flight[0] is not out:
            raise RuntimeError("update() takes the oldest scheduled step not yet updated")
        self._in_flight.popleft()
        tokens = _in_step_order(out, sampled)
        advanced: list[Request] = []
        finished: list[Request] = []
        size = self._blocks.block_size
        live = self._live
        # a token that neither stops the request nor is its last calls nothing (_after_token)
        quiet = self._config.role is not Role.PREFILL
        capacity = self._capacity
        running = RequestStatus.RUNNING
        for request, token in zip(out.decodes, tokens, strict=False):
            if live.get(request.request_id) is not request:
                continue  # aborted in between
            request.num_pending -= 1
            outputs = request.output_token_ids
            outputs.append(token)
            known = len(request.prompt_token_ids) + len(outputs)
            computed = request.num_computed_tokens
            if (computed if computed < known else known) % size == 0:
                self._blocks.commit_full_blocks(request)  # a block just filled up
            advanced.append(request)
            if not (
                quiet
                and token not in request.stop_ids
                and known < request.token_limit
                and known <= capacity
            ):
                self._after_token(request)
            if request.status is not running:
                finished.append(request)
        prefill_tokens = iter(tokens[len(out.decodes) :])
        appended: dict[str, tuple[int, ...]] = {}
        for request, chunk in zip(out.prefill_requests, out.prefills, strict=True):
            sampled_token = next(prefill_tokens) if chunk.sample else None
            if live.get(request.request_id) is not request:
                continue
            if chunk.num_draft and sampled_token is not None:
                request.num_pending -= 1
                extra = tuple((more or {}).get(request.request_id, ()))
                n = self._accept(request, (sampled_token, *extra))
                if n > 1:
                    appended[request.request_id] = extra[: n - 1]
                advanced.append(request)
                if request.status is not running:
                    finished.append(request)
                continue
            if sampled_token is not None:
                request.num_pending -= 1
                request.output_token_ids.append(sampled_token)
            self._blocks.commit_full_blocks(request)
            if sampled_token is not None:
                advanced.append(request)
                self._after_token(request)
                if request.status is not running:
                    finished.append(request)
        return StepUpdate(tuple(advanced), appended, tuple(finished))

    def forget_in_flight(self) -> None:
        """After a failed step: no scheduled step will be updated. Abort their requests."""
        self._in_flight.clear()

    # ---- internals ----------------------------------------------------------------------

    def _schedule_decodes(self, step: _Step) -> tuple[list[Request], list[int]]:
        """Running requests with one token left to compute: the step's decodes (a pass over
        the running batch with no call per request unless one needs a block)."""
        decodes: list[Request] = []
        starts: list[int] = []
        size = self._blocks.block_size
        capacity = self._capacity
        prefill = self._config.role is Role.PREFILL
        running = RequestStatus.RUNNING
        scheduled = step.scheduled
        budget = step.budget
        for request in list(self._running):
            if budget == 0:
                break
            if request.status is not running:
                continue  # preempted earlier in this step
            computed = request.num_computed_tokens
            pending = request.num_pending
            n = len(request.prompt_token_ids) + len(request.output_token_ids) + pending
            if n - computed != 1:
                continue
            if pending and (n >= request.token_limit or n > capacity or prefill):
                continue  # it finishes (or is pinned) when its pending token arrives
            if request.draft_token_ids:
                step.budget = budget
                drafted = self._schedule_draft(request, step)
                budget = step.budget
                if drafted:
                    continue  # a speculative chunk: this token and the guesses after it
            if computed >= len(request.block_ids) * size:  # crosses into a new block
                step.budget = budget
                grew = self._grow(request, computed + 1, step)
                budget = step.budget  # a preemption gives back its victim's tokens
                if not grew:
                    continue
                step.grown.append(request)
            scheduled[request.request_id] = 1
            budget -= 1
            decodes.append(request)
            starts.append(computed)
        step.budget = budget
        return decodes, starts

    def _schedule_draft(self, request: Request, step: _Step) -> bool:
        """Plan a decode with its guesses as one chunk (engine.speculative). False: no guess
        fits (budget, length limits) or the blocks for them could not be had."""
        computed, n = request.num_computed_tokens, request.num_tokens
        limit = min(request.token_limit - n, self._capacity - computed) - 1
        k = min(len(request.draft_token_ids), step.budget - 1, limit)
        if k <= 0:
            return False
        blocks = self._blocks.blocks_for(computed + 1 + k)
        if blocks > len(request.block_ids) + self._blocks.num_free_blocks:
            return False  # guesses never preempt anyone: decode this one plainly
        if not self._blocks.allocate(request, computed + 1 + k):
            return False
        step.add(request, 1 + k)
        step.prefills.append(request.request_id)
        step.drafts[request.request_id] = k
        return True

    def _accept(self, request: Request, tokens: Sequence[int]) -> int:
        """Append a speculative chunk's verified tokens up to a stop; the blocks of the
        rejected guesses go back. Returns how many were appended."""
        n = 0
        for token in tokens:
            request.output_token_ids.append(token)
            n += 1
            if request.check_stop() is not None:
                break
        request.num_computed_tokens += n - 1  # the KV of the accepted guesses is computed
        self._blocks.trim(request, request.num_known_tokens)
        self._blocks.commit_full_blocks(request)
        self._after_token(request)
        return n

    def _schedule_prefills(self, step: _Step) -> None:
        """The rest of the running requests' prompts (or recomputed tokens), chunked."""
        for request in list(self._running):
            if step.budget == 0:
                return
            if request.status is not RequestStatus.RUNNING or request.request_id in step.scheduled:
                continue  # preempted earlier in this step, or already planned
            remaining = request.num_tokens - request.num_computed_tokens
            if remaining == 1:
                continue  # a decode that did not fit
            num_tokens = self._chunk_len(remaining, step.budget)
            if num_tokens and self._grow(request, request.num_computed_tokens + num_tokens, step):
                step.add(request, num_tokens)
                step.prefills.append(request.request_id)

    def _grow(self, request: Request, num_tokens: int, step: _Step) -> bool:
        """Allocate for a running request, preempting the newest ones; False if it was."""
        while not self._blocks.allocate(request, num_tokens):
            victim = self._running[-1]
            self._preempt(victim, step)
            if victim is request:
                return False
        return True

    def _admit_waiting(self, step: _Step) -> None:
        while self._waiting and step.budget > 0:
            if len(self._running) + len(self._importing) >= self._config.max_num_seqs:
                return
            request = self._waiting[0]
            if request.num_pending:
                return  # preempted while its token was pending: readmitted once it arrives
            hits = self._blocks.match_prefix(request.all_token_ids)
            cached = len(hits) * self._blocks.block_size
            num_tokens = self._chunk_len(request.num_tokens - cached, step.budget)
            if not num_tokens or not self._blocks.allocate(request, cached + num_tokens, hits):
                return  # in order: the head waits, nobody overtakes it
            self._waiting.popleft()
            self._start_running(request)
            step.add(request, num_tokens)
            step.prefills.append(request.request_id)

    def _chunk_len(self, remaining: int, budget: int) -> int:
        """Tokens to compute now out of remaining; 0 when it must wait for a later step."""
        if remaining <= budget:
            return remaining
        if self._config.enable_chunked_prefill or remaining > self._config.max_num_batched_tokens:
            return budget  # without chunking, a prompt larger than any step is chunked anyway
        return 0

    def _chunk(self, request: Request, num_tokens: int, num_draft: int = 0) -> ScheduledChunk:
        start = request.num_computed_tokens
        end = start + num_tokens - num_draft
        tokens = _token_slice(request, start, end)
        if num_draft:
            tokens += tuple(request.draft_token_ids[:num_draft])
        return ScheduledChunk(
            request_id=request.request_id,
            token_ids=tokens,
            start=start,
            block_table=tuple(request.block_ids),
            sample=end == request.num_tokens,
            num_draft=num_draft,
        )

    def _after_token(self, request: Request) -> None:
        reason = request.check_stop()
        if reason is not None:
            self._finish(request, reason)
        elif self._config.role is Role.PREFILL:
            self._running.remove(request)
            request.status = RequestStatus.PINNED
            request.finish_reason = FinishReason.PREFILLED
            self._pinned[request.request_id] = request
        elif request.num_known_tokens > self._capacity:
            self._finish(request, FinishReason.LENGTH)  # the next token's KV cannot fit

    def _preempt(self, request: Request, step: _Step) -> None:
        self._running.remove(request)
        self._blocks.free(request)
        request.num_computed_tokens = 0
        request.num_cached_tokens = 0
        request.num_preemptions += 1
        request.draft_token_ids = []  # guesses were for this step only
        request.status = RequestStatus.WAITING
        self._queue(request)
        step.drop(request)


def _token_slice(request: Request, start: int, end: int) -> tuple[int, ...]:
    prompt = request.prompt_token_ids
    if end <= len(prompt):
        return tuple(prompt[start:end])
    outputs = request.output_token_ids
    return tuple(prompt[start:]) + tuple(outputs[max(0, start - len(prompt)) : end - len(prompt)])


def _in_step_order(out: SchedulerOutput, sampled: Mapping[str, int] | Sequence[int]) -> list[int]:
    """The sampled tokens as a list in step order: decodes, then sampled prefill chunks."""
    if not isinstance(sampled, Mapping):
        if len(sampled) != out.num_sampled:
            raise ValueError(f"{len(sampled)} sampled tokens for {out.num_sampled} rows")
        return list(sampled)
    ids = [r.request_id for r in out.decodes] + [c.request_id for c in out.prefills if c.sample]
    missing = [rid for rid in ids if rid not in sampled]
    if missing:
        raise KeyError(f"no sampled token for request {missing[0]}")
    return [sampled[rid] for rid in ids]
