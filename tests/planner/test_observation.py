"""Rates and latency quantiles between two scrapes, as Prometheus would compute them."""

from __future__ import annotations

import math

import pytest
from series import Cluster

from planner.observation import observe, quantile


def test_quantile_interpolates_within_the_bucket() -> None:
    buckets = {0.1: 0.0, 1.0: 10.0, math.inf: 10.0}
    assert quantile(buckets, 0.5) == pytest.approx(0.55)
    assert quantile({0.1: 0.0, math.inf: 0.0}, 0.9) is None
    # past the last finite bound: that bound (histogram_quantile does the same)
    assert quantile({1.0: 0.0, math.inf: 4.0}, 0.9) == 1.0


def test_rates_and_quantiles_over_the_interval_only() -> None:
    c = Cluster()
    c.add("p0", "prefill")
    c.add("d0", "decode", running=3)
    c.serve("p0", tokens=5000, requests=50, ttft=[20.0] * 50)  # before the first scrape
    before = c.scrape()
    c.now = 10.0
    c.serve("p0", tokens=1000, requests=10, ttft=[0.2] * 10, itl=[0.04] * 100)
    obs = observe(before, c.scrape(), 0.9)
    assert obs.dt == 10.0
    assert obs.pools["prefill"].tokens_per_s == pytest.approx(100.0)
    assert obs.pools["prefill"].tokens_per_request == pytest.approx(100.0)
    assert obs.pools["decode"].running == 3 and obs.pools["decode"].busiest == 3
    assert obs.ttft_s is not None and 0.1 < obs.ttft_s <= 0.25  # the old 20 s do not count
    assert obs.itl_s is not None and 0.01 < obs.itl_s <= 0.05
    assert obs.requests_per_s == pytest.approx(1.0)


def test_a_restarted_node_counts_from_zero_and_a_new_one_from_its_next_scrape() -> None:
    c = Cluster()
    c.add("p0", "prefill")
    c.serve("p0", tokens=9000, requests=9)
    before = c.scrape()
    c.now = 5.0
    c.restart("p0")
    c.serve("p0", tokens=500, requests=5)
    c.add("p1", "prefill")
    c.serve("p1", tokens=7000, requests=7)  # no earlier value: not counted yet
    obs = observe(before, c.scrape(), 0.9)
    assert obs.pools["prefill"].tokens_per_s == pytest.approx(100.0)
    assert obs.pools["prefill"].replicas == 2


def test_scrapes_must_move_forward() -> None:
    c = Cluster()
    first = c.scrape()
    with pytest.raises(ValueError, match="dt=0"):
        observe(first, c.scrape(), 0.9)
    with pytest.raises(ValueError, match="samples"):
        observe(first, c.scrape(reachable=False), 0.9)
