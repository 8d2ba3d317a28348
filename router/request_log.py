"""The router's requests by id for GET /debug/requests/{id}: every one in flight, and the
last `keep` finished with their phase timings."""

from __future__ import annotations

from collections import OrderedDict

from router.trail import Trail

KEEP_FINISHED = 1000


class RequestLog:
    """Trails by x-request-id and by the id the nodes know (they may differ)."""

    def __init__(self, keep: int = KEEP_FINISHED) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._keep = keep
        self._live: dict[str, Trail] = {}
        self._done: OrderedDict[int, Trail] = OrderedDict()  # by id(trail), oldest first
        self._ids: dict[str, Trail] = {}  # finished ones, every id they answer to

    def add(self, trail: Trail) -> None:
        self._live[trail.request_id] = trail

    def name(self, trail: Trail, internal_id: str) -> None:
        """The id the nodes know `trail`'s request by."""
        trail.internal_id = internal_id
        self._live[internal_id] = trail

    def done(self, trail: Trail) -> None:
        for key in _keys(trail):
            if self._live.get(key) is trail:
                del self._live[key]
            self._ids[key] = trail
        self._done[id(trail)] = trail
        while len(self._done) > self._keep:
            _, old = self._done.popitem(last=False)
            for key in _keys(old):
                if self._ids.get(key) is old:
                    del self._ids[key]

    def find(self, request_id: str) -> Trail | None:
        return self._live.get(request_id) or self._ids.get(request_id)

    @property
    def live(self) -> int:
        return len({id(t) for t in self._live.values()})


def _keys(trail: Trail) -> list[str]:
    return [trail.request_id, *([trail.internal_id] if trail.internal_id else [])]
