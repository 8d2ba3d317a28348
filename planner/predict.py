"""Load a few intervals ahead: a least-squares line through the recent intervals."""

from __future__ import annotations

from collections import deque


class TrendPredictor:
    """Keeps the last `history` loads; `predict` extends their trend `horizon` steps."""

    def __init__(self, history: int, horizon: int) -> None:
        if history < 2 or horizon < 0:
            raise ValueError(f"need history >= 2 and horizon >= 0, got {history}, {horizon}")
        self._loads: deque[float] = deque(maxlen=history)
        self.horizon = horizon

    def add(self, load: float) -> None:
        self._loads.append(max(0.0, load))

    def peak(self) -> float:
        """The highest load of the history: a pool shrinks only below it (sparse traffic
        has empty intervals that are no fall in load)."""
        return max(self._loads, default=0.0)

    def predict(self) -> float:
        """The line's value `horizon` intervals after the last one (never below 0); the last
        load itself while fewer than two are known."""
        ys = list(self._loads)
        if len(ys) < 2:
            return ys[-1] if ys else 0.0
        n = len(ys)
        mean_x, mean_y = (n - 1) / 2, sum(ys) / n
        sxx = sum((x - mean_x) ** 2 for x in range(n))
        slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(ys)) / sxx
        return max(0.0, mean_y + slope * (n - 1 - mean_x + self.horizon))
