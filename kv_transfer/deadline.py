"""A point in monotonic time by which a transfer must be done."""

from __future__ import annotations

import time
from dataclasses import dataclass

from kv_transfer.errors import TransferTimeout


@dataclass(frozen=True)
class Deadline:
    """`at` is a `time.monotonic()` value; `budget_s` is what the caller asked for."""

    at: float
    budget_s: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        if not seconds > 0:
            raise ValueError(f"deadline_s must be > 0, got {seconds!r}")
        return cls(time.monotonic() + seconds, seconds)

    def remaining(self) -> float:
        """Seconds left; raises TransferTimeout when none are."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise TransferTimeout(f"transfer exceeded its deadline of {self.budget_s:.3f} s")
        return left

    def left(self) -> float:
        """Seconds left, negative once past."""
        return self.at - time.monotonic()

    def expired(self) -> bool:
        return time.monotonic() >= self.at
