"""Scheduling one step: which tokens of which requests run, within the token budget and the
sequence cap, preempting when blocks run out (the order and the rules: engine.scheduler).

The step scheduler advances the requests as if the step ran: their computed tokens grow and the
sampled ones become pending. It changes the queues only to admit and to preempt; requests
finish and leave in the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.config import EngineConfig, Role
from engine.kv.block_manager import BlockManager
from engine.kv.state_checkpoints import CheckpointHit, StateCheckpoints
from engine.kv.tier_book import TierHit
from engine.scheduler.kv_imports import HeldImports
from engine.scheduler.lookahead import Lookahead
from engine.scheduler.plan import ScheduledChunk, SchedulerOutput
from engine.scheduler.queues import RunningRequests, WaitingQueue
from engine.scheduler.request import Request, RequestStatus
from engine.scheduler.step_adapters import StepAdapters
from engine.scheduler.swap import StateRoom, SwapRule


@dataclass
class _Step:
    budget: int
    scheduled: dict[str, int] = field(default_factory=dict)  # request id -> tokens
    prefills: list[Request] = field(default_factory=list)  # chunks other than decodes, in order
    preempted: list[str] = field(default_factory=list)
    swapped: list[str] = field(default_factory=list)  # of preempted, those swapped out
    grown: list[Request] = field(default_factory=list)  # decodes given a block
    ahead: dict[str, tuple[int, ...]] = field(default_factory=dict)  # tokens ahead of a decode
    adapters: StepAdapters | None = None  # with LoRA: the step's distinct adapters

    def add(self, request: Request, num_tokens: int) -> None:
        self.scheduled[request.request_id] = num_tokens
        self.budget -= num_tokens

    def drop(self, request: Request) -> None:
        self.budget += self.scheduled.pop(request.request_id, 0)
        self.preempted.append(request.request_id)


class StepScheduler:
    """Schedules steps over a scheduler's queues and blocks. Not thread-safe."""

    def __init__(
        self,
        config: EngineConfig,
        blocks: BlockManager,
        waiting: WaitingQueue,
        running: RunningRequests,
        imports: HeldImports,
        lookahead: Lookahead | None,
        swap: SwapRule | None = None,
        state_room: StateRoom | None = None,
        checkpoints: StateCheckpoints | None = None,
    ) -> None:
        self._config = config
        self._checkpoints = checkpoints
        self._swap = swap
        self._state_room = state_room
        self._blocks = blocks
        self._waiting = waiting
        self._running = running
        self._imports = imports
        self._lookahead = lookahead
        self._capacity = blocks.num_total_blocks * blocks.block_size  # tokens the cache holds

    def schedule(self) -> SchedulerOutput:
        """One step, with the requests advanced as if it ran."""
        config = self._config
        step = _Step(budget=config.max_num_batched_tokens)
        if config.enable_lora:
            step.adapters = StepAdapters(config.max_loras)
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
        requests = [r for r in step.prefills if r.request_id in step.scheduled]
        chunks = tuple(
            self._chunk(r, step.scheduled[r.request_id], step.ahead.get(r.request_id, ()))
            for r in requests
        )
        for request in decodes:
            request.num_computed_tokens += 1
            request.num_pending += 1
        for request, chunk in zip(requests, chunks, strict=True):
            request.num_computed_tokens += chunk.num_tokens - chunk.num_draft
            request.num_pending += chunk.sample
        grown = tuple(r for r in step.grown if r.request_id in step.scheduled)
        return SchedulerOutput(
            chunks, tuple(step.preempted), tuple(decodes), tuple(starts), tuple(requests), grown,
            tuple(step.swapped),
        )  # fmt: skip

    def _schedule_decodes(self, step: _Step) -> tuple[list[Request], list[int]]:
        """Running requests with one token left to compute: the step's decodes (a pass over
        the running batch with no call per request unless one needs a block)."""
        decodes: list[Request] = []
        starts: list[int] = []
        size = self._blocks.block_size
        capacity = self._capacity
        prefill = self._config.role is Role.PREFILL
        running = RequestStatus.RUNNING
        lookahead = self._lookahead
        scheduled = step.scheduled
        budget = step.budget
        adapters = step.adapters
        for request in list(self._running.requests):
            if budget == 0:
                break
            if request.status is not running:
                continue  # preempted earlier in this step
            computed = request.num_computed_tokens
            pending = request.num_pending
            n = len(request.prompt_token_ids) + len(request.output_token_ids) + pending
            if n - computed != 1:
                continue
            if adapters is not None and not adapters.admits(request):
                continue  # its adapter waits for a step with a free slot
            if pending and (n >= request.token_limit or n > capacity or prefill):
                continue  # it finishes (or is pinned) when its pending token arrives
            if lookahead is not None:
                step.budget = budget
                planned = self._schedule_ahead(request, step, lookahead)
                budget = step.budget
                if planned:
                    continue  # one chunk: this token and the tokens ahead of it
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

    def _schedule_ahead(self, request: Request, step: _Step, lookahead: Lookahead) -> bool:
        """Plan a decode and the tokens the lookahead computes ahead of it as one chunk.
        False: none are asked for or fit, or their blocks could not be had (no preemption)."""
        computed = request.num_computed_tokens
        limit = min(request.token_limit - request.num_tokens, self._capacity - computed) - 1
        ahead = tuple(lookahead.tokens_ahead(request, min(step.budget - 1, limit)))
        if not ahead or not self._blocks.allocate(request, computed + 1 + len(ahead)):
            return False
        step.add(request, 1 + len(ahead))
        step.prefills.append(request)
        step.ahead[request.request_id] = ahead
        return True

    def _schedule_prefills(self, step: _Step) -> None:
        """The rest of the running requests' prompts (or recomputed tokens), chunked."""
        for request in list(self._running.requests):
            if step.budget == 0:
                return
            if request.status is not RequestStatus.RUNNING or request.request_id in step.scheduled:
                continue  # preempted earlier in this step, or already planned
            remaining = request.num_tokens - request.num_computed_tokens
            if remaining == 1:
                continue  # a decode that did not fit
            if step.adapters is not None and not step.adapters.admits(request):
                continue
            num_tokens = self._chunk_len(remaining, step.budget)
            if num_tokens and self._grow(request, request.num_computed_tokens + num_tokens, step):
                step.add(request, num_tokens)
                step.prefills.append(request)

    def _grow(self, request: Request, num_tokens: int, step: _Step) -> bool:
        """Allocate for a running request, preempting the newest ones; False if it was."""
        while not self._blocks.allocate(request, num_tokens):
            victim = self._running.last
            self._preempt(victim, step)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request, step: _Step) -> None:
        """Back to the waiting queue without blocks: swapped out when the swap rule says so
        and the host tier has room, else to be recomputed from its tokens so far."""
        self._running.remove(request)
        swap = self._swap
        if (
            swap is not None
            and swap.prefers_swap(len(request.block_ids), request.num_computed_tokens)
            and self._swap_out(request)
        ):
            step.swapped.append(request.request_id)
        else:
            self._blocks.free(request)
            request.num_computed_tokens = 0
            request.num_cached_tokens = 0
        request.num_preemptions += 1
        if self._lookahead is not None:
            self._lookahead.drop(request)
        request.status = RequestStatus.WAITING
        self._waiting.push(request)
        step.drop(request)

    def _swap_out(self, request: Request) -> bool:
        """The request's blocks to the host tier, with room for its linear-attention states
        first (a hybrid model's); False (nothing kept) when either is full."""
        room, rid = self._state_room, request.request_id
        if room is not None and not room.reserve(rid):
            return False
        if self._blocks.swap_out(request):
            return True
        if room is not None:
            room.release(rid)
        return False

    def _admit_waiting(self, step: _Step) -> None:
        waiting, running = self._waiting, self._running
        while waiting and step.budget > 0:
            if len(running) + len(self._imports) >= self._config.max_num_seqs:
                return
            request = waiting.head
            if request.num_pending:
                return  # preempted while its token was pending: readmitted once it arrives
            if step.adapters is not None and not step.adapters.admits(request):
                return  # its adapter has no slot in this step
            num_tokens = self._admit(request, step.budget)
            if not num_tokens:
                return  # in order: the head waits, nobody overtakes it
            waiting.pop_head()
            running.start(request)
            step.add(request, num_tokens)
            step.prefills.append(request)

    def _admit(self, request: Request, budget: int) -> int:
        """Blocks for a waiting request's first chunk (its prefix found in any tier, or its
        swapped blocks back): the chunk's tokens, 0 (nothing changed) when short."""
        blocks = self._blocks
        if request.swapped_slots:
            cached = request.num_computed_tokens
            num_tokens = self._chunk_len(request.num_tokens - cached, budget)
            if not num_tokens or not blocks.swap_in(request, cached + num_tokens):
                return 0
        else:
            hits, lower, resume = self._prefix(request)
            cached = (len(hits) + len(lower)) * blocks.block_size
            num_tokens = self._chunk_len(request.num_tokens - cached, budget)
            if not num_tokens or not blocks.allocate(request, cached + num_tokens, hits, lower):
                return 0
            if self._checkpoints is not None:
                self._checkpoints.claim(request.request_id, *resume)
        return num_tokens

    def _prefix(
        self, request: Request
    ) -> tuple[list[int], list[TierHit], tuple[CheckpointHit | None, int]]:
        """The request's cached leading blocks (on the device, then below), and for a hybrid
        model the checkpoint they are cut back to (a hit resumes only from one) and how many
        matched."""
        blocks, root, tokens = self._blocks, request.hash_root, request.all_token_ids
        hits = blocks.match_prefix(tokens, root)
        lower = blocks.match_lower(tokens, hits, root)
        matched = len(hits) + len(lower)
        if self._checkpoints is None:
            return hits, lower, (None, matched)
        hit = self._checkpoints.find(tokens, root, matched)
        n = hit.num_blocks if hit is not None else 0
        return hits[:n], lower[: max(0, n - len(hits))], (hit, matched)

    def _chunk_len(self, remaining: int, budget: int) -> int:
        """Tokens to compute now out of remaining; 0 when it must wait for a later step."""
        if remaining <= budget:
            return remaining
        if self._config.enable_chunked_prefill or remaining > self._config.max_num_batched_tokens:
            return budget  # without chunking, a prompt larger than any step is chunked anyway
        return 0

    def _chunk(self, request: Request, num_tokens: int, ahead: tuple[int, ...]) -> ScheduledChunk:
        start = request.num_computed_tokens
        end = start + num_tokens - len(ahead)
        return ScheduledChunk(
            request_id=request.request_id,
            token_ids=_token_slice(request, start, end) + ahead,
            start=start,
            block_table=tuple(request.block_ids),
            sample=end == request.num_tokens,
            num_draft=len(ahead),
        )


def _token_slice(request: Request, start: int, end: int) -> tuple[int, ...]:
    prompt = request.prompt_token_ids
    if end <= len(prompt):
        return tuple(prompt[start:end])
    outputs = request.output_token_ids
    return tuple(prompt[start:]) + tuple(outputs[max(0, start - len(prompt)) : end - len(prompt)])
