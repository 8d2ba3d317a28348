"""Admission: how many requests the router serves at once, and the queue of those waiting.

Up to `limit` requests are served at once: `max_inflight`, or fewer when the pools hold
fewer (`capacity`, from what the nodes report: router.capacity), so a request past what the
cluster holds waits here, before any work is done on it. Later ones wait in a queue ordered
by (priority, arrival), lower priority first, as the nodes order theirs. Only a full queue
(`max_queued` waiting) or a wait that outlasts the request's deadline answers 429 with
Retry-After.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from router.errors import overloaded
from router.metrics import RouterMetrics


class Ticket:
    """One admitted request; `release` is idempotent."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission

    def release(self) -> None:
        if self._admission is not None:
            self._admission.release()
            self._admission = None


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    granted: asyncio.Future[None] = field(compare=False)


def _unknown() -> int | None:
    return None


class Admission:
    """Bounds the requests served at once; the rest wait by (priority, arrival)."""

    def __init__(
        self,
        max_inflight: int,
        max_queued: int,
        retry_after_s: int,
        metrics: RouterMetrics,
        capacity: Callable[[], int | None] = _unknown,
    ) -> None:
        """`capacity`: the requests the cluster holds now, None when unknown."""
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        self.retry_after_s = retry_after_s
        self.inflight = 0
        self._capacity = capacity
        self._waiting: list[_Waiter] = []  # a heap
        self._seq = itertools.count()
        self._metrics = metrics

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def limit(self) -> int:
        """Requests served at once now: max_inflight, or what the cluster holds if fewer."""
        held = self._capacity()
        return self.max_inflight if held is None else max(1, min(self.max_inflight, held))

    async def admit(self, priority: int = 0, wait_s: float | None = None) -> Ticket:
        """A slot now, or once the requests before this one in the queue are served.
        429 when the queue is full or no slot came within `wait_s` seconds."""
        arrived = time.monotonic()
        if self.inflight < self.limit and not self._waiting:
            self._take()
        else:
            await self._wait(priority, wait_s)
        self._metrics.observe_queue(priority, time.monotonic() - arrived)
        return Ticket(self)

    def release(self) -> None:
        """A served request ended: its slot goes to the first waiter, if any."""
        self.inflight -= 1
        self._grant()

    def _grant(self) -> None:
        """Slots to the first waiters while there are free ones (the limit may have grown)."""
        limit = self.limit
        while self._waiting and self.inflight < limit:
            waiter = heapq.heappop(self._waiting)
            if not waiter.granted.done():  # skip a waiter that gave up meanwhile
                self._take()
                waiter.granted.set_result(None)
        self._publish()

    async def _wait(self, priority: int, wait_s: float | None) -> None:
        if len(self._waiting) >= self.max_queued:
            raise overloaded(
                f"the router is serving {self.inflight} requests and {len(self._waiting)} wait "
                f"(limits {self.limit} and {self.max_queued})",
                self.retry_after_s,
            )
        waiter = _Waiter(priority, next(self._seq), asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiting, waiter)
        self._grant()
        try:
            async with asyncio.timeout(wait_s):
                await asyncio.shield(waiter.granted)
        except BaseException as exc:
            self._give_up(waiter)
            if isinstance(exc, TimeoutError):
                raise overloaded(
                    f"no slot within {wait_s:.1f}s in the router's queue", self.retry_after_s
                ) from None
            raise

    def _give_up(self, waiter: _Waiter) -> None:
        """A waiter timed out or was cancelled: hand back a slot it got at the last moment,
        else leave the queue."""
        if waiter.granted.done():
            self.release()
            return
        waiter.granted.cancel()
        self._waiting.remove(waiter)
        heapq.heapify(self._waiting)
        self._publish()

    def _take(self) -> None:
        self.inflight += 1
        self._publish()

    def _publish(self) -> None:
        self._metrics.inflight.set(self.inflight)
        self._metrics.queued.set(len(self._waiting))
        self._metrics.admission_limit.set(self.limit)
