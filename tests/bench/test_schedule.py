"""The rate schedule: Poisson arrivals whose rate changes at each phase, grouped back by
phase; bad schedules are refused naming the phase."""

from __future__ import annotations

import argparse

import pytest

from bench.schedule import Phase, parse_schedule, phase_records, schedule_arrivals


def test_arrivals_follow_each_phase_rate() -> None:
    phases = parse_schedule("2:100, 10:100,2:100")
    assert phases == (Phase(2, 100), Phase(10, 100), Phase(2, 100))
    arrivals = schedule_arrivals(phases, seed=3)
    assert arrivals[0] == (0.0, 0)
    times = [t for t, _ in arrivals]
    assert times == sorted(times) and times[-1] < 300
    counts = [sum(1 for _, i in arrivals if i == k) for k in range(3)]
    assert 150 < counts[0] < 250 and 850 < counts[1] < 1150 and 150 < counts[2] < 250
    for t, i in arrivals:
        assert 100 * i <= t < 100 * (i + 1)
    assert schedule_arrivals(phases, seed=3) == arrivals  # seeded
    records = [{"n": n} for n in range(len(arrivals))]
    grouped = phase_records(records, arrivals, phases)
    assert [len(r) for _, r in grouped] == counts


@pytest.mark.parametrize("bad", ["", "1", "1:0", "0:10", "a:10", "1:10,2"])
def test_bad_schedules_name_the_phase(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="schedule"):
        parse_schedule(bad)
