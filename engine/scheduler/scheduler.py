"""Continuous batching over the block manager: integers in, a SchedulerOutput out.

Each step has a token budget (max_num_batched_tokens) and a cap on live sequences
(max_num_seqs). The order is: running decodes (one token each), then the rest of running
prefills (chunked when longer than the budget left), then waiting requests in (priority,
arrival) order (lower priority first; FIFO among equals), while blocks last. A running
request that needs a block when none is free preempts the last running request in that
order, the lowest priority and newest (itself, if it is that one): its blocks are freed and
it goes back to the waiting queue at its place, to be recomputed from prompt + tokens so far,
or (with a host KV tier, when the swap rule of engine.scheduler.swap finds it cheaper) with
its KV swapped out, to be copied back at readmission.

Protocol: `schedule()`, run the chunks, `update(out, sampled)`. `schedule()` advances the
requests as if the step ran, their sampled tokens pending: with overlapped scheduling the
next `schedule()` comes before this `update()` and decodes the pending tokens; updates come
in scheduling order. A request whose pending token would end it by length is not scheduled
again; one that stops on the token itself (EOS, a stop id) finishes at its update, and the
step planned meanwhile drops its row. After a failed step, `forget_in_flight()` and abort.

The scheduler is the facade of small parts (see the class); speculative decoding plugs in as
a lookahead: tokens computed ahead of a decode in the same chunk (engine.scheduler.lookahead).

Limits, decided: a request whose tokens alone need more blocks than the whole cache is
refused at `add()` with RequestTooLargeError (a ValueError). A request that grows to the
cache's capacity finishes with FinishReason.LENGTH, like one reaching the context length.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from engine.config import EngineConfig, Role
from engine.kv.block_manager import BlockManager
from engine.kv.state_checkpoints import StateCheckpoints
from engine.scheduler.kv_imports import HeldImports
from engine.scheduler.lookahead import Lookahead
from engine.scheduler.plan import ImportPlan, RequestTooLargeError, SchedulerOutput, StepUpdate
from engine.scheduler.queues import LiveRequests, RunningRequests, WaitingQueue
from engine.scheduler.request import FinishReason, Request, RequestStatus
from engine.scheduler.step_scheduler import StepScheduler
from engine.scheduler.swap import StateRoom, SwapRule
from engine.scheduler.updater import StepUpdater


class Scheduler:
    """Decides which tokens of which requests run each step. Not thread-safe.

    Made of small parts: the live requests, the waiting queue and the running batch
    (engine.scheduler.queues), the imports held for disaggregated decode
    (engine.scheduler.kv_imports), the block manager and its prefix cache (engine.kv), the
    step scheduler (engine.scheduler.step_scheduler) and the step updater
    (engine.scheduler.updater).
    `lookahead`: tokens computed ahead of decodes (speculative decoding's guesses,
    engine.scheduler.lookahead); None plans plain decodes.
    `swap`: preemption's cost rule (engine.scheduler.swap); None always recomputes.
    `state_room`: a hybrid model's swap space for the linear-attention states; a request is
    swapped out only with room there too.
    `checkpoints`: a hybrid model's state checkpoints: a prefix hit stops at the last cached
    block whose end has one (engine.kv.state_checkpoints).
    `window`: the sliding window every layer of the model has (0: some layer attends to its
    whole context); a decoding request gives back its blocks behind it.
    """

    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        lookahead: Lookahead | None = None,
        swap: SwapRule | None = None,
        window: int = 0,
        state_room: StateRoom | None = None,
        checkpoints: StateCheckpoints | None = None,
    ) -> None:
        if block_manager.block_size != config.block_size:
            raise ValueError(
                f"block manager block_size {block_manager.block_size} differs from "
                f"EngineConfig.block_size {config.block_size}"
            )
        self._config = config
        self._blocks = block_manager
        self._lookahead = lookahead
        self._live = LiveRequests()
        self._waiting = WaitingQueue(self._live)
        self._running = RunningRequests(self._live)
        self._pinned: dict[str, Request] = {}  # prefill role: first token out, blocks held
        self._imports = HeldImports(block_manager)
        self._step_scheduler = StepScheduler(
            config, block_manager, self._waiting, self._running, self._imports, lookahead, swap,
            state_room, checkpoints,
        )  # fmt: skip
        self._updater = StepUpdater(
            config, block_manager, self._live, lookahead, self._after_token, window
        )
        # tokens the cache holds: no request grows past them, windowed or not (a preempted
        # request is recomputed whole: it must fit)
        self._capacity = block_manager.num_total_blocks * block_manager.block_size
        self._in_flight: deque[SchedulerOutput] = deque()  # scheduled, not yet updated

    # ---- introspection ------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def running(self) -> list[Request]:
        """The running requests, in (priority, arrival) order (do not modify)."""
        return self._running.requests

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_pinned(self) -> int:
        return len(self._pinned)

    @property
    def num_importing(self) -> int:
        return len(self._imports)

    @property
    def has_work(self) -> bool:
        """Whether schedule() may produce chunks: some request waits or runs."""
        return bool(self._waiting or self._running.requests)

    def get(self, request_id: str) -> Request | None:
        """The live request (waiting, running, pinned or importing) with that id."""
        return self._live.get(request_id)

    def audit(self) -> None:
        """Check block accounting against every live request; RuntimeError on a violation."""
        self._blocks.audit(r.owned_block_ids for r in self._live.values())

    # ---- entering and leaving -----------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a new request. ValueError for a reused id; RequestTooLargeError if it can
        never fit in the cache."""
        self._check_new(request, request.num_tokens)
        self._live.enter(request)
        self._waiting.push(request)

    def abort(self, request_id: str) -> bool:
        """Finish a request in any state with ABORT and free its blocks. False when unknown."""
        request = self._live.get(request_id)
        if request is None:
            return False
        if request_id in self._imports:
            self._imports.take(request_id)
        elif request.status is RequestStatus.WAITING:
            self._waiting.remove(request)
        elif request.status is RequestStatus.RUNNING:
            self._running.remove(request)
        else:
            del self._pinned[request_id]
        self._retire(request, FinishReason.ABORT)
        return True

    def release(self, request_id: str) -> bool:
        """Prefill role: free the blocks of a pinned request. False when none is pinned."""
        request = self._pinned.pop(request_id, None)
        if request is None:
            return False
        self._retire(request, FinishReason.PREFILLED)
        return True

    def add_prefilled(
        self, request: Request, output_token_ids: Sequence[int], state_blocks: int = 0
    ) -> ImportPlan | None:
        """Decode role: reserve blocks for a request whose KV is written from outside.

        output_token_ids are the tokens generated elsewhere (usually just the first); the KV
        of the prompt and all of them but the last comes from outside. None: no room now (no
        blocks, or max_num_seqs reached); nothing changed, try again later or recompute.
        The request is held, not scheduled, until `commit_prefilled` (or `abort`).
        `state_blocks`: blocks reserved at the end for a state record (a hybrid model's).
        """
        if self._config.role is not Role.DECODE:
            raise RuntimeError(f"add_prefilled needs role=decode, this is {self._config.role}")
        if not output_token_ids or request.output_token_ids:
            raise ValueError(
                f"request {request.request_id}: add_prefilled takes a request without outputs "
                "and at least one generated token"
            )
        self._check_new(request, request.num_tokens + len(output_token_ids))
        if len(self._running) + len(self._imports) >= self._config.max_num_seqs:
            return None
        plan = self._imports.reserve(request, output_token_ids, state_blocks)
        if plan is not None:
            self._live.enter(request)
        return plan

    def commit_prefilled(self, request_id: str) -> Request | None:
        """Decode role: the KV is written; admit the request into the running batch.

        Returns it (finished already when its last generated token was a stop), or None when
        no request with that id is importing (aborted meanwhile).
        """
        held = self._imports.take(request_id)
        if held is None:
            return None
        request = held.admit()
        self._running.start(request)
        self._blocks.commit_full_blocks(request)
        self._after_token(request)
        return request

    # ---- the step -----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Plan one step within the token budget and the sequence cap, and advance the
        requests as if it ran: the next `schedule()` plans the step after it."""
        out = self._step_scheduler.schedule()
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
        prefill chunks). Requests aborted since `schedule()` are skipped. more: for chunks
        with tokens ahead, the tokens emitted after the first (appended up to a stop).
        """
        if out.is_empty:
            return StepUpdate(())
        if not self._in_flight or self._in_flight[0] is not out:
            raise RuntimeError("update() takes the oldest scheduled step not yet updated")
        self._in_flight.popleft()
        return self._updater.apply(out, out.in_step_order(sampled), more)

    def forget_in_flight(self) -> None:
        """After a failed step: no scheduled step will be updated. Abort their requests."""
        self._in_flight.clear()

    # ---- leaving ------------------------------------------------------------------------

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

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request.status is RequestStatus.WAITING:  # preempted while its token was pending
            self._waiting.remove(request)
        else:
            self._running.remove(request)
        self._retire(request, reason)

    def _retire(self, request: Request, reason: FinishReason) -> None:
        self._blocks.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self._live.leave(request)

    def _check_new(self, request: Request, num_tokens: int) -> None:
        rid = request.request_id
        if rid in self._live:
            raise ValueError(f"request id {rid!r} is already in use")
        if request.status is not RequestStatus.WAITING or request.block_ids:
            raise ValueError(f"request {rid} is not new (status {request.status.value})")
        if num_tokens > self._capacity:
            raise RequestTooLargeError(
                f"request {rid} has {num_tokens} tokens; the KV cache holds at most "
                f"{self._capacity} ({self._blocks.num_total_blocks} blocks of "
                f"{self._blocks.block_size})"
            )
