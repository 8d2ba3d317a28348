"""A load that rises and falls: `--rate-schedule 0.5:30,2:60,0.5:60` sends Poisson arrivals at
0.5 req/s for 30 s, then 2 req/s for 60 s, then 0.5 req/s for 60 s, as one run, and reports
each phase on its own (requests by the phase they were sent in).

The run that sizes a planner: `splitserve up --planner ...` against the same schedule with and
without the planner, and compare the high phase's TTFT p90.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Phase:
    rate: float  # req/s
    seconds: float


def parse_schedule(text: str) -> tuple[Phase, ...]:
    """`RATE:SECONDS,...`; argparse error naming the phase that does not parse."""
    phases = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        rate, sep, seconds = part.partition(":")
        try:
            phase = Phase(float(rate), float(seconds))
        except ValueError:
            phase = None
        if not sep or phase is None or phase.rate <= 0 or phase.seconds <= 0:
            raise argparse.ArgumentTypeError(
                f"rate schedule phase {part!r}: expected RATE:SECONDS, both > 0"
            )
        phases.append(phase)
    if not phases:
        raise argparse.ArgumentTypeError("the rate schedule has no phase")
    return tuple(phases)


def schedule_arrivals(phases: tuple[Phase, ...], seed: int) -> list[tuple[float, int]]:
    """(send time from the start, phase index) of every request: a Poisson stream whose rate
    changes at each phase boundary. The first request goes at once."""
    rng = random.Random(seed)
    out: list[tuple[float, int]] = []
    start = 0.0
    for index, phase in enumerate(phases):
        t = start if not out else start + rng.expovariate(phase.rate)
        while t < start + phase.seconds:
            out.append((t, index))
            t += rng.expovariate(phase.rate)
        start += phase.seconds
    return out


def phase_records(
    records: list[dict[str, Any]], arrivals: list[tuple[float, int]], phases: tuple[Phase, ...]
) -> list[tuple[Phase, list[dict[str, Any]]]]:
    """The records of each phase (records are in arrival order, one per arrival)."""
    grouped: list[list[dict[str, Any]]] = [[] for _ in phases]
    for record, (_, index) in zip(records, arrivals, strict=True):
        grouped[index].append(record)
    return list(zip(phases, grouped, strict=True))
