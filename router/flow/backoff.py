"""Pauses between rounds of tries while every node is busy: growing, jittered so that the
requests waiting together do not come back together, never past the request's deadline."""

from __future__ import annotations

import asyncio
import random
import time

from router.flow.request import Deadline

FIRST_PAUSE_S = 0.05
MAX_PAUSE_S = 1.0


class Backoff:
    """Each pause is twice the last (from `first_s`, up to `max_s`), less up to half at random."""

    def __init__(
        self, deadline: Deadline, first_s: float = FIRST_PAUSE_S, max_s: float = MAX_PAUSE_S
    ) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError(f"Backoff needs 0 < first_s <= max_s, got {first_s} and {max_s}")
        self._deadline = deadline
        self._next = first_s
        self._max = max_s
        self.pauses = 0

    async def pause(self) -> None:
        """Sleep the next pause; the deadline's APIError once the deadline has passed."""
        left = self._deadline.at - time.monotonic()
        if left <= 0:
            raise self._deadline.error()
        await asyncio.sleep(min(self._next * random.uniform(0.5, 1.0), left))
        self._next = min(self._next * 2, self._max)
        self.pauses += 1
