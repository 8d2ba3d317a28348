"""Where a scheduler's requests are: waiting, running, pinned, importing; entering and leaving.

The queues and their invariants, without the planning of steps (engine.scheduler.scheduler).
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections import deque
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.kv.block_manager import BlockManager
from engine.scheduler.plan import RequestTooLargeError
from engine.scheduler.request import FinishReason, Request, RequestStatus


@dataclass
class HeldImport:
    request: Request
    output_token_ids: list[int]


class RequestPool:
    """The live requests of a scheduler by state, in arrival order. Not thread-safe."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        if block_manager.block_size != config.block_size:
            raise ValueError(
                f"block manager block_size {block_manager.block_size} differs from "
                f"EngineConfig.block_size {config.block_size}"
            )
        self._config = config
        self._blocks = block_manager
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []  # (priority, arrival) order: the victim is last
        self._pinned: dict[str, Request] = {}
        self._importing: dict[str, HeldImport] = {}
        self._live: dict[str, Request] = {}
        self._arrival: dict[str, tuple[int, int]] = {}  # id -> (priority, arrival)
        self._counter = itertools.count()

    # ---- introspection ------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def running(self) -> list[Request]:
        """The running requests, in (priority, arrival) order (do not modify)."""
        return self._running

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_pinned(self) -> int:
        return len(self._pinned)

    @property
    def num_importing(self) -> int:
        return len(self._importing)

    @property
    def has_work(self) -> bool:
        """Whether schedule() may produce chunks: some request waits or runs."""
        return bool(self._waiting or self._running)

    def get(self, request_id: str) -> Request | None:
        """The live request (waiting, running, pinned or importing) with that id."""
        return self._live.get(request_id)

    def audit(self) -> None:
        """Check block accounting against every live request; RuntimeError on a violation."""
        self._blocks.audit(r.block_ids for r in self._live.values())

    # ---- entering and leaving -----------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a new request. ValueError for a reused id; RequestTooLargeError if it can
        never fit in the cache."""
        self._check_new(request, request.num_tokens)
        self._enter(request)
        self._queue(request)

    def abort(self, request_id: str) -> bool:
        """Finish a request in any state with ABORT and free its blocks. False when unknown."""
        request = self._live.get(request_id)
        if request is None:
            return False
        if request_id in self._importing:
            del self._importing[request_id]
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
        del self._live[request.request_id]
        del self._arrival[request.request_id]

    def _start_running(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        keys = [self._arrival[r.request_id] for r in self._running]
        position = bisect.bisect(keys, self._arrival[request.request_id])
        self._running.insert(position, request)

    def _queue(self, request: Request) -> None:
        """Into the waiting queue at its (priority, arrival) place."""
        keys = [self._arrival[r.request_id] for r in self._waiting]
        self._waiting.insert(bisect.bisect(keys, self._arrival[request.request_id]), request)

    def _enter(self, request: Request) -> None:
        self._live[request.request_id] = request
        self._arrival[request.request_id] = (request.priority, next(self._counter))

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

    @functools.cached_property
    def _capacity(self) -> int:
        """Tokens the whole cache holds."""
        return self._blocks.num_total_blocks * self._blocks.block_size
