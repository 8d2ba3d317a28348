"""The chaos client's open loop (`--rate`): requests start at their own times, still at most
`concurrency` at a time, and a router that refuses the connection is a clear failure."""

from __future__ import annotations

import asyncio
import socket

import pytest

from bench.chaos.checker import judge
from bench.chaos.client import Outcome, run_all
from bench.chaos.run import RunConfig
from bench.chaos.workload import make_specs


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fixed_arrivals_are_evenly_spaced_and_poisson_ones_fixed_by_the_seed() -> None:
    assert RunConfig(rate=4.0, arrivals="fixed").starts(3) == [0.0, 0.25, 0.5]
    poisson = RunConfig(rate=2.0, seed=3).starts(400)
    assert poisson is not None and poisson == RunConfig(rate=2.0, seed=3).starts(400)
    assert 150 < poisson[-1] < 250  # about 400 / 2 s
    assert RunConfig().starts(3) is None


def test_a_bad_rate_or_arrivals_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="rate must be > 0"):
        RunConfig(rate=0.0)
    with pytest.raises(ValueError, match="arrivals must be one of"):
        RunConfig(arrivals="burst")


def test_requests_start_at_their_times_and_a_refused_connection_fails_clearly() -> None:
    specs = make_specs(4)
    starts = [0.0, 0.3, 0.6, 0.9]
    url = f"http://127.0.0.1:{_closed_port()}"
    outcomes = asyncio.run(run_all(url, specs, 2, 5.0, starts=starts))
    first = outcomes[0].started
    assert all(o.started - first >= s - 0.01 for o, s in zip(outcomes, starts, strict=True))
    expected = Outcome(0, 0.0)
    verdicts = [judge(o, expected, 5.0) for o in outcomes]
    assert {v.kind for v in verdicts} == {"failed_clearly"}, verdicts
    assert all("not sent" in v.why for v in verdicts)
