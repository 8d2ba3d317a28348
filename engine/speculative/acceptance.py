"""The chance that a guess holds, learned from the verified ones, by the kind of proposal.

Guesses differ in how often they hold: on bench.speculative's repeat workload a prompt-lookup
guess that continues a 4-token match held 91% of the time as the first guess, one that
continues a single token found at several places 24%. The table keeps, per kind of proposal,
how often guess j held when the guesses before it had (counts that fade, so that it follows
the traffic), and gives each guess's expected gain: the chance that it and every guess before
it hold, which is what the step's cost model weighs (engine.speculative.cost). A kind that has
not been verified for a while starts again from the prior, so that one judged poor when
guesses were dear is tried again.
"""

from __future__ import annotations

from collections.abc import Hashable

_FADE = 0.98  # weight kept by older outcomes at each new one (about the latest 50 count)
_PRIOR = 0.5  # chance that a guess of an unknown kind holds
_PRIOR_WEIGHT = 2.0  # in outcomes
_STALE_STEPS = 256  # a kind unverified for this many steps is forgotten


class AcceptanceTable:
    """Per kind of proposal: held / reached for guess 1 .. k (reached: the guesses before it
    held, so it was verified)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._held: dict[Hashable, list[float]] = {}
        self._reached: dict[Hashable, list[float]] = {}
        self._seen: dict[Hashable, int] = {}
        self.step = 0

    def gains(self, kind: Hashable, n: int) -> list[float]:
        """Expected extra tokens from guess 1 .. n of a proposal of this kind (non-increasing)."""
        seen = self._seen.get(kind)
        if seen is not None and self.step - seen > _STALE_STEPS:
            self._forget(kind)
        held = self._held.get(kind)
        reached = self._reached.get(kind)
        out: list[float] = []
        gain = 1.0
        for j in range(n):
            h = held[j] if held is not None else 0.0
            r = reached[j] if reached is not None else 0.0
            gain *= (h + _PRIOR * _PRIOR_WEIGHT) / (r + _PRIOR_WEIGHT)
            out.append(gain)
        return out

    def record(self, kind: Hashable, proposed: int, accepted: int) -> None:
        """A proposal of this kind had `accepted` of its `proposed` guesses hold (a prefix)."""
        held = self._held.setdefault(kind, [0.0] * self.k)
        reached = self._reached.setdefault(kind, [0.0] * self.k)
        for j in range(min(proposed, self.k)):
            held[j] *= _FADE
            reached[j] *= _FADE
            if j <= accepted:  # verified: every guess before it held
                reached[j] += 1.0
                held[j] += 1.0 if j < accepted else 0.0
        self._seen[kind] = self.step

    def _forget(self, kind: Hashable) -> None:
        self._held.pop(kind, None)
        self._reached.pop(kind, None)
        self._seen.pop(kind, None)
