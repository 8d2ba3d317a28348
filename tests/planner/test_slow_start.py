"""The planner and `splitserve up --planner`'s scaler together, on an injected clock, over a
node that takes longer to load than the up cool-down: the node it asked for counts as a
replica while it loads, joins the pool, and is drained (once the load fell) only after it
has served for the down cool-down. The nodes are stand-in processes; a node enters the
registry LOAD_S after its start."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from series import Cluster

from cluster.planner_status import PlannerStatus
from launcher.process import Child, stop_all
from launcher.scaler import LocalScaler
from launcher.up_plan import NodePlan
from planner.config import PlannerConfig
from planner.planner import Planner

CONFIG = PlannerConfig(
    ttft_slo_ms=1500.0,
    min_prefill=1,
    max_prefill=2,
    min_decode=1,
    max_decode=2,
    interval_s=5.0,
    up_cooldown_s=30.0,
    down_cooldown_s=60.0,
)
LOAD_S = 45.0  # a node's load: longer than the up cool-down
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


class _Up:
    """The launcher's lists, stand-in node processes and the registry they join once loaded."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.registry = Cluster()
        self.started: dict[str, float] = {}
        self.nodes = [NodePlan.bound("prefill-0", "prefill", "prefill")]
        self.nodes.append(NodePlan.bound("decode-0", "decode", "decode"))
        self.children = [self.start(n) for n in self.nodes]
        for plan in self.nodes:
            self.registry.add(plan.name, plan.role)

    def start(self, plan: NodePlan) -> Child:
        self.started[plan.name] = self.registry.now
        log = self.run_dir / f"{plan.name}.log"
        return Child(plan.name, SLEEPER, log, dict(os.environ), plan.listener)

    def settle(self, draining: set[str]) -> None:
        """Loaded nodes register; draining ones have left the registry."""
        roles = {n.name: n.role for n in self.nodes}
        for name, at in self.started.items():
            if name in draining:
                self.registry.nodes.pop(name, None)
            elif self.registry.now - at >= LOAD_S and name not in self.registry.nodes:
                self.registry.add(name, roles[name])

    def prefill(self) -> list[str]:
        return sorted(n for n, v in self.registry.nodes.items() if v.role == "prefill")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[_Up]:
    launcher = _Up(tmp_path)
    yield launcher
    stop_all(launcher.children, 5.0)


def _interval(up: _Up, burst: bool) -> None:
    """A burst: prompts queue on prefill-0 and miss the TTFT target. Then a trickle."""
    if burst:
        up.registry.load("prefill-0", running=1, waiting=8)
        up.registry.serve("prefill-0", tokens=2000, requests=20, ttft=[5.0] * 20)
    else:
        up.registry.load("prefill-0", running=0, waiting=0)
        up.registry.serve("prefill-0", tokens=100, requests=1, ttft=[0.2])


def test_a_node_slower_to_load_than_the_cooldown_joins_and_stays(
    up: _Up, capsys: pytest.CaptureFixture[str]
) -> None:
    planner = Planner(CONFIG)
    scaler = LocalScaler("http://unused", up.start, up.nodes, up.children, lambda: None)
    joined_at: float | None = None
    statuses: list[PlannerStatus] = []
    try:
        for tick in range(60):  # 300 s: a burst, then a calm load well under the target
            _interval(up, burst=1 <= tick <= 3)
            statuses.append(planner.tick(up.registry.scrape()))
            scaler.follow(statuses[-1])
            up.registry.now += CONFIG.interval_s
            up.settle(scaler.draining)
            if joined_at is None and "prefill-1" in up.registry.nodes:
                joined_at = up.registry.now
            if "prefill-1" in scaler.draining:
                break
    finally:
        scaler.close()
    out = capsys.readouterr().out
    assert joined_at is not None, out  # it loaded and joined the pool
    assert [n.name for n in up.nodes if n.role == "prefill"] == ["prefill-0", "prefill-1"]
    assert "planner: draining prefill-1 (load_fell)" in out, out
    assert statuses[-1].at - joined_at >= CONFIG.down_cooldown_s  # it served a while
    assert max(s.pools["prefill"].starting for s in statuses) == 1  # counted while loading
