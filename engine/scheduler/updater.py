"""Applying a computed step's tokens, by kind of row: decodes, prefill chunks, and chunks
with tokens ahead of a decode (engine.scheduler.lookahead). What a token ends (a stop, the
length limit, the prefill role's pin) is the scheduler's `after_token`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from engine.config import EngineConfig, Role
from engine.kv.block_manager import BlockManager
from engine.scheduler.lookahead import Lookahead
from engine.scheduler.plan import SchedulerOutput, StepUpdate
from engine.scheduler.queues import LiveRequests
from engine.scheduler.request import Request, RequestStatus


class StepUpdater:
    """Appends a step's tokens to its requests. Not thread-safe."""

    def __init__(
        self,
        config: EngineConfig,
        blocks: BlockManager,
        live: LiveRequests,
        lookahead: Lookahead | None,
        after_token: Callable[[Request], None],
        window: int = 0,
    ) -> None:
        self._blocks = blocks
        # every layer windowed: a decoding request's blocks behind the window go back
        self._window = window
        self._live = live
        self._lookahead = lookahead
        self._after_token = after_token
        # a decode's token that neither stops it nor is its last calls nothing (after_token)
        self._quiet = config.role is not Role.PREFILL
        self._capacity = blocks.num_total_blocks * blocks.block_size  # tokens the cache holds

    def apply(
        self, out: SchedulerOutput, tokens: list[int], more: Mapping[str, Sequence[int]] | None
    ) -> StepUpdate:
        """`tokens`: the sampled ones in step order; `more`: for chunks with tokens ahead, the
        tokens emitted after the first. Requests aborted since the step was planned are
        skipped."""
        advanced: list[Request] = []
        finished: list[Request] = []
        self._decodes(out.decodes, tokens, advanced, finished)
        appended = self._chunks(out, tokens[len(out.decodes) :], more, advanced, finished)
        return StepUpdate(tuple(advanced), appended, tuple(finished))

    def _decodes(
        self,
        decodes: Sequence[Request],
        tokens: list[int],
        advanced: list[Request],
        finished: list[Request],
    ) -> None:
        """Each decode's token (a pass with no call per request unless a block filled up or
        the token may end it)."""
        size = self._blocks.block_size
        live = self._live.by_id
        quiet = self._quiet
        capacity = self._capacity
        running = RequestStatus.RUNNING
        for request, token in zip(decodes, tokens, strict=False):
            if live.get(request.request_id) is not request:
                continue  # aborted in between
            request.num_pending -= 1
            outputs = request.output_token_ids
            outputs.append(token)
            known = len(request.prompt_token_ids) + len(outputs)
            computed = request.num_computed_tokens
            if (computed if computed < known else known) % size == 0:
                self._blocks.commit_full_blocks(request)  # a block just filled up
                if self._window:
                    self._slide(request)
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

    def _chunks(
        self,
        out: SchedulerOutput,
        tokens: list[int],
        more: Mapping[str, Sequence[int]] | None,
        advanced: list[Request],
        finished: list[Request],
    ) -> dict[str, tuple[int, ...]]:
        """The prefill chunks: a sampled one appends its token, one with tokens ahead those
        that stand. Returns the tokens appended after the first, by request id."""
        sampled = iter(tokens)
        live = self._live.by_id
        appended: dict[str, tuple[int, ...]] = {}
        for request, chunk in zip(out.prefill_requests, out.prefills, strict=True):
            token = next(sampled) if chunk.sample else None
            if live.get(request.request_id) is not request:
                continue  # aborted in between
            if token is None:  # part of a prompt: no token yet
                self._blocks.commit_full_blocks(request)
                continue
            request.num_pending -= 1
            if chunk.num_draft:
                extra = tuple((more or {}).get(request.request_id, ()))
                n = self._ahead(request, (token, *extra))
                if n > 1:
                    appended[request.request_id] = extra[: n - 1]
            else:
                request.output_token_ids.append(token)
                self._blocks.commit_full_blocks(request)
                self._after_token(request)
            if self._window:
                self._slide(request)
            advanced.append(request)
            if request.status is not RequestStatus.RUNNING:
                finished.append(request)
        return appended

    def _slide(self, request: Request) -> None:
        """A decoding request's blocks wholly behind the window of the earliest query any
        step still to come (or still running, with overlapped scheduling) can hold go back
        to the pool: that query sits at the last known token, or earlier by the tokens
        sampled and not yet appended. Not between prompt chunks: an overlapped step may
        already hold the next chunk, whose queries start further back."""
        if request.status is RequestStatus.RUNNING:
            earliest = min(request.num_computed_tokens, request.num_known_tokens - 1)
            first_needed = earliest - request.num_pending - self._window + 1
            self._blocks.release_behind(request, first_needed)

    def _ahead(self, request: Request, emitted: Sequence[int]) -> int:
        """A chunk with tokens ahead: the lookahead appends the emitted tokens that stand;
        the KV of the tokens ahead accepted is computed, the blocks past them go back."""
        if self._lookahead is None:
            raise RuntimeError(f"request {request.request_id}: tokens ahead without a lookahead")
        n = self._lookahead.accept(request, emitted)
        request.num_computed_tokens += n - 1
        self._blocks.trim(request, request.num_known_tokens)
        self._blocks.commit_full_blocks(request)
        self._after_token(request)
        return n
