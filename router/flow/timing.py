"""Token arrival times of one request: TTFT for the first token, ITL for each later one."""

from __future__ import annotations

import time

from router.metrics import RouterMetrics


class TokenClock:
    """Observes the router's TTFT and ITL histograms as tokens arrive."""

    def __init__(self, metrics: RouterMetrics, arrived_at: float) -> None:
        self._metrics = metrics
        self._arrived_at = arrived_at
        self._last_token_at = 0.0
        self.ttft_s: float | None = None

    def tokens_arrived(self, n: int) -> None:
        """`n` tokens came together: the first of them ends TTFT or an ITL, the rest count 0."""
        now = time.monotonic()
        if self.ttft_s is None:
            self.ttft_s = now - self._arrived_at
            self._metrics.ttft.observe(self.ttft_s)
        else:
            self._metrics.itl.observe(now - self._last_token_at)
        for _ in range(n - 1):
            self._metrics.itl.observe(0.0)
        self._last_token_at = now
