"""Leases on an owner's exported blocks: held until the reader releases them or they expire."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

logger = logging.getLogger(__name__)

OnFree = Callable[[str, list[int]], None]


@dataclass(frozen=True)
class Lease:
    """`expires_at` is a `time.monotonic()` value (of the table's clock)."""

    request_id: str
    block_ids: tuple[int, ...]
    expires_at: float


class LeaseCounts(NamedTuple):
    leases: int
    blocks: int


class LeaseTable:
    """request id -> leased blocks. Each lease ends exactly once: on `release` or on `expire`.

    `on_free(request_id, block_ids)` is the engine's hook that gives the blocks back; it runs
    on the thread that calls `release` / `expire`, outside the table's lock. Thread safe.
    """

    def __init__(self, on_free: OnFree, clock: Callable[[], float] = time.monotonic) -> None:
        self._on_free = on_free
        self._clock = clock
        self._leases: dict[str, Lease] = {}
        self._lock = threading.Lock()

    def grant(self, request_id: str, block_ids: Sequence[int], ttl_s: float) -> Lease:
        """Pin `block_ids` for `request_id` for `ttl_s` seconds. ValueError on a reused id."""
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        lease = Lease(request_id, tuple(block_ids), self._clock() + ttl_s)
        with self._lock:
            if request_id in self._leases:
                raise ValueError(f"request {request_id!r} already holds a lease")
            self._leases[request_id] = lease
        return lease

    def release(self, request_id: str) -> bool:
        """End the lease now and free its blocks. False if there was none (already ended)."""
        with self._lock:
            lease = self._leases.pop(request_id, None)
        if lease is None:
            return False
        self._free(lease, "released")
        return True

    def expire(self) -> list[str]:
        """Free every lease past its expiry; returns their request ids."""
        now = self._clock()
        with self._lock:
            due = [lease for lease in self._leases.values() if lease.expires_at <= now]
            for lease in due:
                del self._leases[lease.request_id]
        for lease in due:
            self._free(lease, "expired")
        return [lease.request_id for lease in due]

    def get(self, request_id: str) -> Lease | None:
        with self._lock:
            return self._leases.get(request_id)

    def held(self) -> LeaseCounts:
        with self._lock:
            blocks = sum(len(lease.block_ids) for lease in self._leases.values())
            return LeaseCounts(len(self._leases), blocks)

    def _free(self, lease: Lease, why: str) -> None:
        logger.debug("lease of %s %s (%d blocks)", lease.request_id, why, len(lease.block_ids))
        self._on_free(lease.request_id, list(lease.block_ids))
