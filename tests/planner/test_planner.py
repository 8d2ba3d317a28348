"""The planner over synthetic metric series (an injected clock, no sleeps): a burst grows the
prefill pool and idling shrinks it; a node restarted by hand, a node it never saw before
and an unreachable metrics source leave no stuck state."""

from __future__ import annotations

import pytest
from series import Cluster

from cluster.planner_status import PlannerStatus
from planner.config import PlannerConfig
from planner.planner import Planner

CONFIG = PlannerConfig(
    ttft_slo_ms=1000.0,
    itl_slo_ms=100.0,
    min_prefill=1,
    max_prefill=3,
    min_decode=1,
    max_decode=3,
    interval_s=5.0,
    scale_down_intervals=2,
    up_cooldown_s=10.0,
    down_cooldown_s=20.0,
)


def _cluster() -> Cluster:
    c = Cluster()
    c.add("prefill-0", "prefill")
    c.add("decode-0", "decode")
    return c


def _tick(p: Planner, c: Cluster, reachable: bool = True) -> PlannerStatus:
    status = p.tick(c.scrape(reachable))
    c.now += CONFIG.interval_s
    return status


def _follow(c: Cluster, status: PlannerStatus) -> None:
    """The actuator: start or drain nodes (newest first) until each pool has its desired."""
    for pool, wanted in status.pools.items():
        names = [n for n, v in c.nodes.items() if v.role == pool]
        for name in names[wanted.desired :]:
            c.remove(name)
        for i in range(len(names), wanted.desired):
            c.add(f"{pool}-new-{c.now:.0f}-{i}", pool)


def _idle_until_steady(p: Planner, c: Cluster, ticks: int = 40) -> list[PlannerStatus]:
    """Idle intervals, the actuator following each decision."""
    out = []
    for _ in range(ticks):
        for node_id in c.nodes:
            c.load(node_id, running=0)
        out.append(_tick(p, c))
        _follow(c, out[-1])
    return out


def test_a_burst_grows_prefill_and_idling_shrinks_it_back() -> None:
    p, c = Planner(CONFIG), _cluster()
    assert _tick(p, c).pools["prefill"].reason == "warming_up"
    # a burst: TTFT 5 s, a queue builds; nothing learned yet: one more node on the target
    c.load("prefill-0", running=1, waiting=8)
    c.serve("prefill-0", tokens=2000, requests=20, ttft=[5.0] * 20)
    first = _tick(p, c)
    assert (first.pools["prefill"].desired, first.pools["prefill"].reason) == (
        2, "ttft_over_target",
    )  # fmt: skip
    assert first.pools["prefill"].capacity is None  # the queue was not there before
    _follow(c, first)
    # both nodes keep a queue of 8 and get through 400 tokens/s each: that is their limit;
    # 800 tokens/s arriving plus 16 x 100 queued per 5 s, at 80% of 400 per node -> 3 (max)
    for _ in range(4):  # the first interval with the new node teaches nothing, then cool-down
        for node_id in c.nodes:
            if c.nodes[node_id].role == "prefill":
                c.load(node_id, running=1, waiting=8)
                c.serve(node_id, tokens=2000, requests=20, ttft=[5.0] * 20)
        status = _tick(p, c)
        if status.pools["prefill"].direction:
            break
    grown = status.pools["prefill"]
    assert grown.capacity == pytest.approx(400.0)
    assert (grown.desired, grown.direction, grown.reason) == (3, "up", "load")
    _follow(c, status)
    statuses = _idle_until_steady(p, c)
    assert statuses[-1].pools["prefill"].desired == 1
    assert statuses[-1].pools["prefill"].current == 1
    downs = [s.pools["prefill"] for s in statuses if s.pools["prefill"].direction == "down"]
    assert [(d.current, d.desired, d.reason) for d in downs] == [
        (3, 2, "load_fell"),
        (2, 1, "load_fell"),
    ]  # one node at a time
    assert statuses[-1].pools["decode"].desired == 1


def test_a_node_restarted_by_hand_leaves_no_stuck_state() -> None:
    p, c = Planner(CONFIG), _cluster()
    c.add("prefill-1", "prefill")
    c.serve("prefill-1", tokens=50_000, requests=500)
    _tick(p, c)
    c.remove("prefill-1")  # stopped by hand...
    s = _tick(p, c)
    assert s.pools["prefill"].current == 1
    c.add("prefill-1", "prefill")  # ...and started again: counters from zero
    c.restart("prefill-1")
    c.serve("prefill-1", tokens=100, requests=1, ttft=[0.1])
    s = _tick(p, c)
    assert s.pools["prefill"].current == 2 and s.pools["prefill"].load >= 0
    assert _idle_until_steady(p, c)[-1].pools["prefill"].desired == 1


def test_nodes_started_by_someone_else_count_and_are_scaled_down() -> None:
    p, c = Planner(CONFIG), _cluster()
    _tick(p, c)
    for i in range(3):
        c.add(f"by-hand-{i}", "decode")
    s = _tick(p, c)
    assert s.pools["decode"].current == 4 and s.pools["decode"].desired == 3  # max
    assert set(s.pools["decode"].nodes) == {"decode-0", "by-hand-0", "by-hand-1", "by-hand-2"}
    c.remove("by-hand-2")  # the actuator drained one
    final = _idle_until_steady(p, c)[-1].pools["decode"]
    assert final.desired == 1 and final.current == 1


def test_an_unreachable_source_holds_the_decision_then_planning_goes_on() -> None:
    p, c = Planner(CONFIG), _cluster()
    c.add("prefill-1", "prefill")
    _tick(p, c)
    held = [_tick(p, c, reachable=False) for _ in range(5)]
    assert {s.pools["prefill"].reason for s in held} == {"source_unreachable"}
    assert {s.pools["prefill"].desired for s in held} == {2}
    assert not held[-1].source_ok
    after = _idle_until_steady(p, c)
    assert after[0].source_ok and after[-1].pools["prefill"].desired == 1


def test_decode_never_shrinks_below_what_its_running_streams_need() -> None:
    p, c = Planner(CONFIG), _cluster()
    c.add("decode-1", "decode")
    _tick(p, c)
    for _ in range(30):  # 2 x 4 streams, ITL well under target: nodes hold 4 each
        c.load("decode-0", running=4)
        c.load("decode-1", running=4)
        c.serve("decode-0", tokens=0, requests=0, itl=[0.01] * 50)
        s = _tick(p, c)
        assert s.pools["decode"].desired == 2 and s.pools["decode"].floor == 2
