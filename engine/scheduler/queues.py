"""Where a scheduler's requests are: every live one by id, the waiting queue, the running batch.

Both queues keep (priority, arrival) order: lower priority first, FIFO among equals. The keys
are given once, when a request enters (`LiveRequests.enter`), so that a preempted request goes
back to its place.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Iterator, ValuesView

from engine.scheduler.request import Request, RequestStatus


class LiveRequests:
    """Every request a scheduler holds (waiting, running, pinned or importing), by id, with
    its (priority, arrival) key."""

    def __init__(self) -> None:
        self.by_id: dict[str, Request] = {}  # read it, do not modify it
        self._keys: dict[str, tuple[int, int]] = {}  # id -> (priority, arrival)
        self._counter = itertools.count()

    def get(self, request_id: str) -> Request | None:
        return self.by_id.get(request_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.by_id

    def values(self) -> ValuesView[Request]:
        return self.by_id.values()

    def enter(self, request: Request) -> None:
        self.by_id[request.request_id] = request
        self._keys[request.request_id] = (request.priority, next(self._counter))

    def leave(self, request: Request) -> None:
        del self.by_id[request.request_id]
        del self._keys[request.request_id]

    def key(self, request: Request) -> tuple[int, int]:
        """The request's place in either queue."""
        return self._keys[request.request_id]


class WaitingQueue:
    """Requests without blocks (new, or preempted to be recomputed), in (priority, arrival)
    order: the head is admitted first and nobody overtakes it."""

    def __init__(self, live: LiveRequests) -> None:
        self._live = live
        self._queue: deque[Request] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    @property
    def head(self) -> Request:
        return self._queue[0]

    def pop_head(self) -> Request:
        return self._queue.popleft()

    def push(self, request: Request) -> None:
        """Into the queue at its (priority, arrival) place."""
        key = self._live.key
        keys = [key(r) for r in self._queue]
        self._queue.insert(bisect.bisect(keys, key(request)), request)

    def remove(self, request: Request) -> None:
        self._queue.remove(request)


class RunningRequests:
    """Requests holding blocks, being computed or decoded, in (priority, arrival) order: the
    last one is the first to be preempted."""

    def __init__(self, live: LiveRequests) -> None:
        self._live = live
        self.requests: list[Request] = []  # read it, do not modify it

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.requests)

    @property
    def last(self) -> Request:
        """The newest of the lowest priority: preempted first."""
        return self.requests[-1]

    def start(self, request: Request) -> None:
        """The request runs from now on, at its (priority, arrival) place."""
        request.status = RequestStatus.RUNNING
        key = self._live.key
        keys = [key(r) for r in self.requests]
        self.requests.insert(bisect.bisect(keys, key(request)), request)

    def remove(self, request: Request) -> None:
        self.requests.remove(request)
