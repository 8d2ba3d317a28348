"""Wall time of each phase of the engine's steps, for the step-overhead benchmark.

Off by default (then each lap is one attribute test). On a GPU the phases are host time
unless ``synchronize`` is set, which waits for the device at every lap (and so undoes any
overlap: use it only to split a synchronous step). Each phase is timed twice: wall time,
and the CPU time of the engine's thread (which a busy shared machine inflates far less).
"""

from __future__ import annotations

import time
from collections.abc import Callable

PHASES = ("schedule", "prepare", "forward", "sample", "output")


class StepTimer:
    """Sums of the seconds spent in each phase since the last `reset`."""

    def __init__(self) -> None:
        self.enabled = False
        self.synchronize: Callable[[], None] | None = None
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.cpu_totals = dict.fromkeys(PHASES, 0.0)
        self.steps = 0
        self._mark = 0.0
        self._cpu_mark = 0.0

    def reset(self) -> None:
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.cpu_totals = dict.fromkeys(PHASES, 0.0)
        self.steps = 0

    def start(self) -> None:
        """A step begins: the next lap measures from now."""
        if self.enabled:
            self._mark = time.perf_counter()
            self._cpu_mark = time.thread_time()

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap (or `start`) to `phase`."""
        if self.enabled:
            if self.synchronize is not None:
                self.synchronize()
            now, cpu = time.perf_counter(), time.thread_time()
            self.totals[phase] += now - self._mark
            self.cpu_totals[phase] += cpu - self._cpu_mark
            self._mark, self._cpu_mark = now, cpu

    def end_step(self) -> None:
        if self.enabled:
            self.steps += 1

    def means_ms(self, cpu: bool = False) -> dict[str, float]:
        """Milliseconds per step of each phase (cpu: of the thread's CPU time)."""
        n = max(self.steps, 1)
        totals = self.cpu_totals if cpu else self.totals
        return {phase: 1e3 * total / n for phase, total in totals.items()}
