"""How many guesses a step can afford: a cost model fitted to the engine's own steps.

A verified guess costs one more token in the forward and pays only when accepted. Where a
step is memory-bound (a GPU, or a CPU at batch 1) a few more tokens cost almost nothing;
where it is compute-bound (a CPU at batch 8) every token costs about the same and guesses
only pay when nearly all hold. The step time is fitted as a + b * tokens (least squares over
the latest decode steps, whose every token is scored: prefill chunks, which score only
their last token, would understate a guess's cost); while the latest steps all had one
size, one step in eight runs without guesses, so that the line can be drawn. A draft model
adds its own forwards, one per guess depth (every request guessing that deep in one batch),
fitted the same way as a_d + b_d * tokens; when the draft has not run for 64 steps, one
step guesses one token per request, so that a fit made in a bad moment is not kept for good.

Guesses are granted depth by depth: at depth j the requests that got guess j - 1 are ranked
by the expected gain of guess j (the chance that it and the guesses before it hold), and the
number c of them that maximises expected tokens over expected time, (T + their gains) /
(C + a_d + (b + b_d) * c), is taken when that beats T / C; the first depth that does not pay
ends the step's guessing. Without a draft (a_d = b_d = 0) this keeps exactly the guesses
that raise tokens per second.
"""

from __future__ import annotations

import time
from collections import deque

_WINDOW = 64
_MIN_SAMPLES = 8
_PROBE_EVERY = 8  # without a fit, one step in this many runs without guesses
_DRAFT_PROBE_AFTER = 64  # steps without a draft forward after which one step guesses


class LineFit:
    """time = a + b * tokens over the latest samples."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque(maxlen=_WINDOW)

    def add(self, tokens: int, seconds: float) -> None:
        self.samples.append((float(tokens), seconds))

    def fit(self) -> tuple[float, float] | None:
        """(a, b), None before enough samples of more than one size."""
        n = len(self.samples)
        if n < _MIN_SAMPLES:
            return None
        mx = sum(x for x, _ in self.samples) / n
        my = sum(y for _, y in self.samples) / n
        sxx = sum((x - mx) ** 2 for x, _ in self.samples)
        if sxx < 1e-9:
            return None
        b = sum((x - mx) * (y - my) for x, y in self.samples) / sxx
        b = max(b, 1e-7)
        return max(my - b * mx, 0.0), b


class StepCost:
    """Step times against step sizes, and the allocation of guesses that follows."""

    def __init__(self) -> None:
        self.target = LineFit()
        self.draft = LineFit()  # the draft model's forwards (method "draft")
        self._started: float | None = None
        self._tokens = 0
        self._unfitted = 0  # allocations made without a fit
        self._idle_draft = 0  # allocations in a row that granted no draft guess

    def step_started(self, num_tokens: int) -> None:
        """A step of num_tokens tokens starts now."""
        self._started, self._tokens = time.perf_counter(), num_tokens

    def step_ended(self) -> None:
        """The step begun last has its tokens."""
        if self._started is not None and self._tokens:
            self.target.add(self._tokens, time.perf_counter() - self._started)
        self._started = None

    def fit(self) -> tuple[float, float] | None:
        """The target's (a, b) of time = a + b * tokens, None before enough samples."""
        return self.target.fit()

    def allocate(
        self, base_tokens: int, gains: list[list[float]], draft: bool = False
    ) -> list[int]:
        """Guesses per request: gains[i][j] is the expected gain of request i's guess j + 1
        (non-increasing in j); base_tokens the step's tokens without guesses; draft: guesses
        cost draft forwards too."""
        counts = [0] * len(gains)
        fit = self.target.fit()
        draft_fit = self.draft.fit() if draft else (0.0, 0.0)
        if fit is None or draft_fit is None:  # too little known yet: every guess offered,
            self._unfitted += 1  # but when every step has had one size, now and then none
            if len(self.target.samples) >= _MIN_SAMPLES and self._unfitted % _PROBE_EVERY == 0:
                return counts
            return [len(g) for g in gains]
        if draft:
            self._idle_draft += 1
            if self._idle_draft > _DRAFT_PROBE_AFTER:
                self._idle_draft = 0
                return [min(len(g), 1) for g in gains]
        (a, b), (a_d, b_d) = fit, draft_fit
        expected = float(len(gains))  # one token per decoding request at least
        cost = a + b * base_tokens
        depth_rows = [i for i, g in enumerate(gains) if g]
        depth = 0
        while depth_rows:
            ranked = sorted(depth_rows, key=lambda i: -gains[i][depth])
            best_c, best_rate, total = 0, expected / cost, 0.0
            for c, i in enumerate(ranked, start=1):
                total += gains[i][depth]
                rate = (expected + total) / (cost + a_d + (b + b_d) * c)
                if rate > best_rate:
                    best_c, best_rate = c, rate
            if best_c == 0:
                break
            taken = ranked[:best_c]
            expected += sum(gains[i][depth] for i in taken)
            cost += a_d + (b + b_d) * best_c
            for i in taken:
                counts[i] += 1
            depth += 1
            depth_rows = [i for i in taken if len(gains[i]) > depth]
        if any(counts):
            self._idle_draft = 0
        return counts
