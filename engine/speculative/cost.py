"""How many guesses a step can afford: a cost model fitted to the engine's own steps.

A verified guess costs one more token in the forward and pays only when accepted. Where a
step is memory-bound (a GPU, or a CPU at batch 1) a few more tokens cost almost nothing;
where it is compute-bound (a CPU at batch 8) every token costs about the same and guesses
only pay when nearly all hold. The step time is fitted as a + b * tokens (least squares over
the latest decode steps, whose every token is scored: prefill chunks, which score only
their last token, would understate a guess's cost); a guess with expected gain g (the
chance that it and the guesses before it hold) is added while g > b * T / C, T being the
step's expected tokens and C its expected time: exactly when it raises tokens per second.
"""

from __future__ import annotations

import time
from collections import deque

_WINDOW = 64


class StepCost:
    """Step times against step sizes, and the allocation of guesses that follows."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque(maxlen=_WINDOW)
        self._started: float | None = None
        self._tokens = 0

    def step_started(self, num_tokens: int) -> None:
        """A step of num_tokens tokens starts now."""
        self._started, self._tokens = time.perf_counter(), num_tokens

    def step_ended(self) -> None:
        """The step begun last has its tokens."""
        if self._started is not None and self._tokens:
            self._samples.append((float(self._tokens), time.perf_counter() - self._started))
        self._started = None

    def fit(self) -> tuple[float, float] | None:
        """(a, b) of time = a + b * tokens, None before enough varied samples."""
        if len(self._samples) < 8:
            return None
        n = len(self._samples)
        mx = sum(x for x, _ in self._samples) / n
        my = sum(y for _, y in self._samples) / n
        sxx = sum((x - mx) ** 2 for x, _ in self._samples)
        if sxx < 1e-9:
            return None
        b = sum((x - mx) * (y - my) for x, y in self._samples) / sxx
        b = max(b, 1e-7)
        a = max(my - b * mx, 0.0)
        return a, b

    def allocate(self, base_tokens: int, gains: list[list[float]]) -> list[int]:
        """Guesses per request: gains[i][j] is the expected gain of request i's guess j + 1
        (non-increasing in j); base_tokens the step's tokens without guesses."""
        fit = self.fit()
        if fit is None:  # too little known yet: every guess offered (the fit needs spread)
            return [len(g) for g in gains]
        a, b = fit
        offers = sorted(((g, i) for i, row in enumerate(gains) for g in row), key=lambda o: -o[0])
        expected = float(len(gains))  # one token per decoding request at least
        cost = a + b * base_tokens
        counts = [0] * len(gains)
        for gain, i in offers:
            if gain * cost <= b * expected:
                break
            counts[i] += 1
            expected += gain
            cost += b
        return counts
