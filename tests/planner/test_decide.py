"""One pool's decision on given inputs: growth on load or a missed target, shrinking one node
at a time after a steady streak, cool-downs, the limits and the running requests' floor."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.config import PlannerConfig, PoolLimits
from planner.decide import PoolDecider, PoolInputs

CONFIG = PlannerConfig(
    min_prefill=1, max_prefill=4, scale_down_intervals=3, up_cooldown_s=30, down_cooldown_s=60
)
IDLE = PoolInputs(
    replicas=1,
    load=0.0,
    predicted=0.0,
    peak=0.0,
    capacity=None,
    proven=0.0,
    slo_ratio=None,
    floor=0,
)


def _decider() -> PoolDecider:
    return PoolDecider("ttft", CONFIG.prefill, CONFIG)


def test_a_missed_target_adds_one_node_then_waits_for_the_cooldown() -> None:
    d = _decider()
    slow = replace(IDLE, load=500.0, predicted=500.0, slo_ratio=3.0)
    first = d.decide(slow, now=0.0)
    assert (first.desired, first.reason, first.direction) == (2, "ttft_over_target", "up")
    # the new node is still starting (the registry shows 1): the decision holds, no pile-up
    assert d.decide(slow, now=10.0).desired == 2
    assert d.decide(replace(slow, replicas=2), now=20.0).desired == 2
    assert d.decide(replace(slow, replicas=2), now=31.0).desired == 3


def test_a_node_still_loading_after_the_cooldown_counts_until_it_registers() -> None:
    d = _decider()
    slow = replace(IDLE, load=500.0, predicted=500.0, slo_ratio=3.0)
    assert d.decide(slow, now=0.0).desired == 2
    # the cool-down is over, the node still loads: it counts, and the target missed without
    # it asks for no third node; calm, the pool does not shrink under it either
    for t, x in ((35.0, slow), (40.0, IDLE)):
        decision = d.decide(x, now=t)
        assert decision.desired == 2
        assert (decision.starting, decision.reason) == (1, "starting")
    # registered at 45: the down cool-down counts from there
    calm = [d.decide(replace(IDLE, replicas=2), now=45.0 + t) for t in range(0, 65, 5)]
    assert [c.desired for c in calm] == [2] * 12 + [1]
    assert (calm[-1].reason, calm[-1].starting) == ("load_fell", 0)


def test_a_node_that_never_registers_counts_until_the_start_timeout() -> None:
    d = PoolDecider("ttft", CONFIG.prefill, replace(CONFIG, start_timeout_s=100))
    d.decide(replace(IDLE, load=500.0, predicted=500.0, slo_ratio=3.0), now=0.0)
    assert d.decide(IDLE, now=99.0).desired == 2
    after = d.decide(IDLE, now=100.0)
    assert (after.desired, after.starting, after.reason) == (1, 0, "steady")


def test_a_missed_target_without_contention_adds_nothing() -> None:
    d = _decider()
    slow = replace(IDLE, load=50.0, predicted=50.0, slo_ratio=3.0, contended=False)
    assert {d.decide(slow, now=float(t)).desired for t in range(0, 100, 5)} == {1}


def test_a_learned_capacity_sizes_the_pool_to_the_predicted_load() -> None:
    d = _decider()
    busy = replace(IDLE, load=1000.0, predicted=2000.0, capacity=1000.0, slo_ratio=0.5)
    decision = d.decide(busy, now=0.0)
    assert (decision.desired, decision.reason) == (3, "load")  # 2000 / (1000 * 0.8) -> 3
    huge = replace(busy, predicted=1e9)
    assert d.decide(huge, now=100.0).desired == 4  # max replicas


def test_shrinking_needs_a_streak_and_goes_one_node_at_a_time() -> None:
    d = _decider()
    idle3 = replace(IDLE, replicas=3)
    reasons = [d.decide(idle3, now=t).reason for t in (0.0, 5.0)]
    assert reasons == ["scale_down_pending"] * 2
    third = d.decide(idle3, now=10.0)
    assert (third.desired, third.direction) == (2, "down")
    assert d.decide(replace(IDLE, replicas=2), now=20.0).reason == "cooldown"
    # after the cool-down, another streak
    for t in (71.0, 76.0):
        assert d.decide(replace(IDLE, replicas=2), now=t).desired == 2
    assert d.decide(replace(IDLE, replicas=2), now=81.0).desired == 1
    for t in range(200, 300, 5):  # never below min
        assert d.decide(IDLE, now=float(t)).desired == 1


def test_hysteresis_keeps_a_pool_that_would_be_too_full_when_smaller() -> None:
    d = _decider()
    # 2 nodes of 1000 tokens/s, 600 tokens/s of load: one node would be at 60% > 50%
    steady = PoolInputs(2, 600.0, 600.0, 600.0, 1000.0, 1000.0, 0.3, 0)
    assert {d.decide(steady, now=float(t)).desired for t in range(0, 100, 5)} == {2}
    lighter = replace(steady, load=400.0, predicted=400.0, peak=400.0)
    assert [d.decide(lighter, now=100.0 + t).desired for t in (0, 5, 10)] == [2, 2, 1]


def test_an_empty_interval_of_sparse_traffic_is_no_fall_in_load() -> None:
    d = _decider()
    # 2 nodes of 1000 tokens/s; intervals alternate 0 and 800 tokens/s: the peak is 800
    sparse = PoolInputs(2, 0.0, 0.0, 800.0, 1000.0, 1000.0, None, 0)
    assert {d.decide(sparse, now=float(t)).desired for t in range(0, 200, 5)} == {2}


def test_latency_near_target_blocks_shrinking() -> None:
    d = _decider()
    near = PoolInputs(2, 10.0, 10.0, 10.0, 1000.0, 1000.0, 0.8, 0)
    assert {d.decide(near, now=float(t)).desired for t in range(0, 100, 5)} == {2}


def test_never_below_what_running_requests_need() -> None:
    d = _decider()
    running = replace(IDLE, replicas=3, floor=2)
    desired = [d.decide(running, now=float(t)).desired for t in range(0, 400, 5)]
    assert desired[-1] == 2 and min(desired) == 2
    # a pool below the floor (a node died) grows back at once, cool-down or not
    grow = d.decide(replace(IDLE, replicas=1, floor=2), now=401.0)
    assert (grow.desired, grow.reason) == (2, "floor")


def test_limits_apply_to_nodes_started_by_hand() -> None:
    d = _decider()
    too_many = d.decide(replace(IDLE, replicas=6), now=0.0)
    assert (too_many.desired, too_many.reason) == (4, "max")
    none = d.decide(replace(IDLE, replicas=0), now=1.0)
    assert (none.desired, none.reason) == (1, "min")


def test_hold_keeps_the_last_decision() -> None:
    d = _decider()
    assert d.hold(3, "source_unreachable").desired == 3  # none yet: the registry's, clamped
    d.decide(replace(IDLE, load=9.0, predicted=9.0, slo_ratio=2.0, replicas=3), now=0.0)
    assert d.hold(1, "source_unreachable").desired == 4


def test_bad_config_is_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="max replicas"):
        PoolLimits(3, 2)
    with pytest.raises(ValueError, match="scale_down_utilization"):
        PlannerConfig(scale_down_utilization=0.9, scale_up_utilization=0.8)
    with pytest.raises(ValueError, match="ttft_slo_ms"):
        PlannerConfig(ttft_slo_ms=0)
    with pytest.raises(ValueError, match="start_timeout_s"):
        PlannerConfig(start_timeout_s=0)
