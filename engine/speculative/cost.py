"""How many guesses a step can afford: a cost model fitted to the engine's own steps.

A verified guess costs one more token in the forward and pays only when accepted. Where a
step is memory-bound (a GPU, or a CPU at batch 1) a few more tokens cost almost nothing;
where it is compute-bound (a CPU at batch 8) every token costs about the same and guesses
only pay when nearly all hold. The step time is fitted as a + b * tokens (least squares over
the latest decode steps, whose every token is scored: prefill chunks, which score only
their last token, would understate a guess's cost); until the line can be drawn, steps
with every guess offered and steps with none take turns. A draft model
adds its own forwards, one per guess depth (every request guessing that deep in one batch),
fitted the same way as a_d + b_d * tokens, and a request's first guess also pays for the
tokens the draft must catch up on: once, so that share is spread over the steps the request
may still take (its remaining tokens over its expected tokens per step). Before the draft's
line is drawn the steps that guess give guesses to the 1, 2, 4, ... requests the draft is
least behind on, not to all: a draft too dear to run is found out after catching up on a few
prompts, not on every one. When the draft has not run for 64 steps, one request of one
step gets a guess, so that a fit made in a bad moment is not kept for good; each probe that
changes nothing doubles the wait (up to 1024 steps), since its catching up is dear.

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
_MIN_SAMPLES = 4
_DRAFT_PROBE_AFTER = 64  # steps without a draft forward after which one step guesses
_DRAFT_PROBE_MAX = 1024  # the wait doubles after each probe that changes nothing, up to this


class Backoff:
    """A wait that doubles (up to `cap`) each time it is used up with nothing changed."""

    def __init__(self, start: int, cap: int) -> None:
        self.start, self.cap, self.value = start, cap, start

    def use(self) -> int:
        """The wait now; the next one is twice as long."""
        value, self.value = self.value, min(2 * self.value, self.cap)
        return value

    def reset(self) -> None:
        self.value = self.start


class LineFit:
    """time = a + b * tokens over the latest samples."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque(maxlen=_WINDOW)
        self._line: tuple[float, float] | None = None

    def add(self, tokens: int, seconds: float) -> None:
        """A sample; the line is drawn again when the window holds two sizes or more (else
        the last line stands)."""
        self.samples.append((float(tokens), seconds))
        n = len(self.samples)
        if n < _MIN_SAMPLES:
            return
        mx = sum(x for x, _ in self.samples) / n
        my = sum(y for _, y in self.samples) / n
        sxx = sum((x - mx) ** 2 for x, _ in self.samples)
        if sxx < 1e-9:
            return
        b = max(sum((x - mx) * (y - my) for x, y in self.samples) / sxx, 1e-7)
        self._line = max(my - b * mx, 0.0), b

    def fit(self) -> tuple[float, float] | None:
        """(a, b), None before enough samples of more than one size."""
        return self._line


class StepCost:
    """Step times against step sizes, and the allocation of guesses that follows."""

    def __init__(self) -> None:
        self.target = LineFit()
        self.draft = LineFit()  # the draft model's guessing forwards (method "draft")
        self.catch_up = LineFit()  # and its catching up on tokens it has not seen
        self._started: float | None = None
        self._tokens = 0
        self._unfitted = 0  # allocations made without a fit
        self._explore = 1  # requests given guesses by the next such step with a draft
        self._idle_draft = 0  # allocations in a row that granted no draft guess
        self._probe = Backoff(_DRAFT_PROBE_AFTER, _DRAFT_PROBE_MAX)

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
        self,
        base_tokens: int,
        gains: list[list[float]],
        draft: bool = False,
        behind: list[int] | None = None,
        remaining: list[int] | None = None,
    ) -> list[int]:
        """Guesses per request: gains[i][j] is the expected gain of request i's guess j + 1
        (non-increasing in j); base_tokens the step's tokens without guesses; draft: guesses
        cost draft forwards too, and behind[i] tokens the draft must catch up on before
        request i's first guess; remaining[i] the tokens request i may still emit (none
        given: the catching up is charged to this step alone)."""
        counts = [0] * len(gains)
        fit = self.target.fit()
        draft_fit = self.draft.fit() if draft else (0.0, 0.0)
        behind = behind or [0] * len(gains)
        if fit is None or draft_fit is None:  # too little known yet: steps with every guess
            self._unfitted += 1  # offered and steps with none, in turn, to draw the line from
            if fit is None and self._unfitted % 2 == 1:
                return counts
            if not draft:
                return [len(g) for g in gains]
            asking = sorted((i for i, g in enumerate(gains) if g), key=lambda i: behind[i])
            for i in asking[: self._explore]:  # the draft's first steps: a few requests
                counts[i] = len(gains[i])
            self._explore *= 2
            return counts
        if draft:
            self._idle_draft += 1
            if self._idle_draft > self._probe.value:  # one guess for the request the draft
                self._idle_draft = 0  # is least behind on
                self._probe.use()
                asking = [i for i, g in enumerate(gains) if g]
                if asking:
                    counts[min(asking, key=lambda i: behind[i])] = 1
                return counts
        (a, b), (a_d, b_d) = fit, draft_fit
        caught = self.catch_up.fit()
        b_c = caught[1] if caught is not None else b  # a token caught up on (else: a target's)
        # this step's share of the draft's catching up on each request, paid once by its
        # first guess: spread over the steps it may still take (its remaining tokens over
        # the tokens a step gives it when every guess is granted; at least this one step)
        catch = [0.0] * len(gains)
        if draft:
            for i, g in enumerate(gains):
                steps = max(1.0, remaining[i] / (1.0 + sum(g))) if remaining else 1.0
                catch[i] = b_c * behind[i] / steps
        expected = float(len(gains))  # one token per decoding request at least
        cost = a + b * base_tokens
        rows = [i for i, g in enumerate(gains) if g]
        depth = 0
        while rows:
            # a guess's price: its target token and draft row, and at the first depth the
            # share of the draft's catching up on the request
            price = {i: b + b_d + (catch[i] if depth == 0 else 0.0) for i in rows}
            ranked = sorted(rows, key=lambda i: -gains[i][depth] / price[i])
            best_c, best_rate, total, spent = 0, expected / cost, 0.0, a_d
            for c, i in enumerate(ranked, start=1):
                total += gains[i][depth]
                spent += price[i]
                rate = (expected + total) / (cost + spent)
                if rate > best_rate:
                    best_c, best_rate = c, rate
            if best_c == 0:
                break
            taken = ranked[:best_c]
            expected += sum(gains[i][depth] for i in taken)
            cost += a_d + sum(price[i] for i in taken)
            for i in taken:
                counts[i] += 1
            depth += 1
            rows = [i for i in taken if len(gains[i]) > depth]
        if any(counts):
            self._idle_draft = 0
            self._probe.reset()
        return counts
