"""Admission of KV imports on a decode node: requests wait for KV blocks in a bounded queue
served in (priority, arrival) order, each until its own deadline, instead of failing.

Only the head of the queue asks the engine for blocks (every RETRY_S while the cache or the
batch is full), so an urgent request that arrives late is served before the ones already
waiting, and nobody overtakes the head. A full queue, or a wait past the request's
deadline, answers 503 (the router tries another decode node, then waits and tries again).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Callable

from decode_node.importer import DecodeJob
from engine.engine import LLMEngine
from engine.loop.engine_loop import EngineLoop
from engine.scheduler.plan import ImportPlan
from node.errors import NodeError, checked_async

RETRY_S = 0.02


class ImportQueue:
    """Imports waiting for blocks. `max_waiting` bounds the queue; `max_wait_s` caps any
    request's wait (a request's own `wait_s` may shorten it)."""

    def __init__(self, loop: EngineLoop, max_waiting: int, max_wait_s: float) -> None:
        if max_waiting < 1 or max_wait_s <= 0:
            raise ValueError("ImportQueue needs max_waiting >= 1 and max_wait_s > 0")
        self._loop = loop
        self.max_waiting = max_waiting
        self.max_wait_s = max_wait_s
        self._keys: list[tuple[int, int]] = []  # (priority, arrival) of the waiting, sorted
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._keys)

    async def reserve(self, job: DecodeJob) -> ImportPlan:
        """Blocks for the job's KV; NodeError 400 for a request that can never fit, 503 when
        the queue is full or the job's deadline passes first."""
        req = job.req
        if len(self._keys) >= self.max_waiting:
            raise NodeError(503, "overloaded", f"{self.max_waiting} imports already wait here")
        wait = min(req.wait_s or self.max_wait_s, self.max_wait_s)
        deadline = time.monotonic() + wait
        key = (req.priority, next(self._arrivals))
        bisect.insort(self._keys, key)
        try:
            while not job.aborted:
                if self._keys[0] == key:
                    plan = await checked_async(self._loop.call(_attempt(job)), "prompt_token_ids")
                    if plan is not None:
                        return plan
                if time.monotonic() >= deadline:
                    break
                await asyncio.sleep(RETRY_S)
        finally:
            self._keys.remove(key)
        raise NodeError(503, "overloaded", f"no free KV blocks on this node within {wait:.1f}s")


def _attempt(job: DecodeJob) -> Callable[[LLMEngine], ImportPlan | None]:
    req = job.req

    def attempt(engine: LLMEngine) -> ImportPlan | None:
        return engine.import_request(
            req.request_id,
            list(req.prompt_token_ids),
            list(req.output_token_ids),
            job.params,
            req.priority,
            lora=job.lora,
        )

    return attempt
