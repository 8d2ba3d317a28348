"""`splitserve up --planner`'s actuator with stand-in node processes: it starts nodes up to the
desired replicas, counting nodes in the registry that it did not start, acts once per
decision, and drains its idlest, newest node (never one it did not start)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.planner_status import PlannerStatus, PoolStatus
from launcher.process import Child, stop_all
from launcher.scaler import LocalScaler
from launcher.up_plan import NodePlan

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


class _Launcher:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.nodes = [NodePlan("prefill-0", "prefill", "prefill", 1)]
        self.nodes.append(NodePlan("decode-0", "decode", "decode", 2))
        self.children = [self.start(n) for n in self.nodes]
        self.changes = 0

    def start(self, plan: NodePlan) -> Child:
        return Child(plan.name, SLEEPER, self.run_dir / f"{plan.name}.log", dict(os.environ))

    def changed(self) -> None:
        self.changes += 1


@pytest.fixture
def up(tmp_path: Path) -> Iterator[_Launcher]:
    launcher = _Launcher(tmp_path)
    yield launcher
    stop_all(launcher.children, 5.0)


def _status(at: float, prefill: dict[str, int], desired: int) -> PlannerStatus:
    pools = {
        "prefill": PoolStatus(current=len(prefill), desired=desired, nodes=prefill, reason="x"),
        "decode": PoolStatus(current=1, desired=1, nodes={"decode-0": 0}),
    }
    return PlannerStatus(
        at=at, interval_s=1, source_ok=True, ttft_target_s=1, itl_target_s=0.1, pools=pools
    )


def _alive(up: _Launcher) -> list[str]:
    return sorted(c.name for c in up.children if c.exit_code() is None)


def test_starts_up_to_desired_once_and_drains_its_own_idlest_newest(up: _Launcher) -> None:
    scaler = LocalScaler("http://unused", up.start, up.nodes, up.children, up.changed)
    try:
        scaler.follow(_status(1.0, {"prefill-0": 3}, desired=3))
        assert [n.name for n in up.nodes if n.role == "prefill"] == [
            "prefill-0", "prefill-1", "prefill-2",
        ]  # fmt: skip
        scaler.follow(_status(1.0, {"prefill-0": 3}, desired=3))  # the same decision: no-op
        scaler.follow(_status(2.0, {"prefill-0": 3, "prefill-1": 0}, desired=3))  # starting
        assert len(up.nodes) == 4 and up.changes == 2
        # desired 1: the two idle nodes go, newest first; the busy prefill-0 stays
        scaler.follow(_status(3.0, {"prefill-0": 3, "prefill-1": 0, "prefill-2": 0}, 1))
        assert scaler.draining == {"prefill-1", "prefill-2"}
        for child in up.children:
            if child.name in scaler.draining:
                child.proc.wait(timeout=10)  # SIGTERM reached it
        assert _alive(up) == ["decode-0", "prefill-0"]
    finally:
        scaler.close()


def test_counts_nodes_it_did_not_start_and_never_drains_them(up: _Launcher) -> None:
    scaler = LocalScaler("http://unused", up.start, up.nodes, up.children, up.changed)
    try:
        scaler.follow(_status(1.0, {"prefill-0": 0, "by-hand": 0}, desired=2))
        assert len(up.nodes) == 2  # nothing started: by-hand counts
        scaler.follow(_status(2.0, {"prefill-0": 0, "by-hand": 0, "other": 0}, desired=1))
        assert scaler.draining == {"prefill-0"}  # its only node; the others are not its own
    finally:
        scaler.close()
