"""Stop strings over streamed text.

Text arrives in arbitrary chunks, so a stop string can span chunks. The matcher emits text
as soon as it cannot be the start of a stop string and holds back the longest tail that
still could be; on a match it emits the text before the stop string and nothing after.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class StopResult(NamedTuple):
    """What to emit now, and whether a stop string ended the text."""

    text: str
    stopped: bool


class StopMatcher:
    """Finds the earliest stop string across successive `feed` calls."""

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(stops)
        self._max_hold = max((len(s) - 1 for s in self._stops), default=0)
        self._pending = ""
        self.stopped = False
        self.after = ""  # once stopped: what followed the stop string in what was fed
        self.matched: str | None = None  # once stopped: the stop string found

    def feed(self, text: str) -> StopResult:
        """Add text; return what is safe to emit. After a stop, everything is swallowed."""
        if self.stopped:
            return StopResult("", True)
        if not self._stops:
            return StopResult(text, False)
        buf = self._pending + text
        hit = self._earliest_match(buf)
        if hit is not None:
            at, stop = hit
            self.stopped = True
            self._pending = ""
            self.after = buf[at + len(stop) :]
            self.matched = stop
            return StopResult(buf[:at], True)
        keep = self._held_tail(buf)
        self._pending = buf[len(buf) - keep :] if keep else ""
        return StopResult(buf[: len(buf) - keep], False)

    def flush(self) -> str:
        """The held-back tail, once no more text will come."""
        text, self._pending = self._pending, ""
        return "" if self.stopped else text

    def _earliest_match(self, buf: str) -> tuple[int, str] | None:
        """(where, which) of the earliest stop string in buf."""
        found = [(i, s) for s in self._stops if (i := buf.find(s)) >= 0]
        return min(found, key=lambda hit: hit[0]) if found else None

    def _held_tail(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop string."""
        for keep in range(min(self._max_hold, len(buf)), 0, -1):
            tail = buf[len(buf) - keep :]
            if any(s.startswith(tail) for s in self._stops):
                return keep
        return 0
