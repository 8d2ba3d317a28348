"""What `splitserve up` shows while its nodes start: each node's start-up phases as they pass
(`prefill-0: weights 3.1s`), each node's readiness, and, every STATUS_S without news, where
the nodes still starting are.

Nodes log a phase as key=value lines (engine.phases): `phase=NAME begin`, then
`phase=NAME seconds=S` once it has passed: kernels (the C kernels, compiled at a first start,
then cached), weights, kv_cache and transfer. This module reads them from the nodes' logs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

PHASE = re.compile(r"\bphase=(?P<name>[a-z_]+) (?:seconds=(?P<seconds>[0-9.]+)|begin)\b")
STATUS_S = 10.0  # a status line after this long without other news


class LogTail:
    """The complete lines a growing file gained since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:  # not created yet
            return []
        self._offset += len(data)
        *done, self._partial = (self._partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in done]


@dataclass
class _Starting:
    tail: LogTail
    current: str = "starting"  # the phase it is in
    passed: set[str] = field(default_factory=set)  # a rank or a draft model logs them again


class StartProgress:
    """Relays the phases of the nodes in `logs` (name -> log file) through `say`."""

    def __init__(
        self,
        logs: Mapping[str, Path],
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nodes = {name: _Starting(LogTail(path)) for name, path in logs.items()}
        self._say, self._clock = say, clock
        self._started = self._last_said = clock()

    def poll(self) -> None:
        """Show the phases logged since the last poll, or a status line when due."""
        for name, node in self._nodes.items():
            for line in node.tail.lines():
                if (match := PHASE.search(line)) is not None:
                    self._note(name, node, match)
        if self._nodes and self._clock() - self._last_said >= STATUS_S:
            waiting = ", ".join(f"{n} ({s.current})" for n, s in self._nodes.items())
            self._show(f"starting ({self._clock() - self._started:.0f}s): {waiting}")

    def ready(self, name: str) -> None:
        """`name` answers ready: shown once, and no longer waited for."""
        self.poll()
        if self._nodes.pop(name, None) is not None:
            self._show(f"{name}: ready after {self._clock() - self._started:.1f}s")

    def _note(self, name: str, node: _Starting, match: re.Match[str]) -> None:
        phase, seconds = match["name"], match["seconds"]
        if seconds is None:
            node.current = phase
        elif phase not in node.passed:
            node.passed.add(phase)
            node.current = f"after {phase}"
            self._show(f"{name}: {phase} {float(seconds):.1f}s")

    def _show(self, text: str) -> None:
        self._say(f"  {text}")
        self._last_said = self._clock()
