"""`splitserve up --planner`: the launcher follows the planner's decisions on this machine,
as KEDA / HPA do in Kubernetes. About once a second it reads the planner's GET /status
and, per pool, starts nodes or drains (SIGTERM: node.drain) nodes it started itself until
the pool holds the desired replicas.

A pool's replicas are the nodes in the registry (the planner counts every node, whoever
started it) together with the nodes this launcher is still starting, less those it is
draining; a decision it has acted on is not acted on again. It drains the node running the
fewest requests, the newest first; a node it did not start is never drained from here.
"""

from __future__ import annotations

import logging
import re
import signal
import time
from collections.abc import Callable

import httpx
from pydantic import ValidationError

from cluster.planner_status import PlannerStatus, PoolStatus
from launcher.process import Child
from launcher.up_plan import NodePlan

log = logging.getLogger("splitserve.launcher")

CHECK_S = 1.0
POOLS = ("prefill", "decode")


class LocalScaler:
    """Starts and drains the launcher's nodes; `nodes` and `children` are the launcher's
    lists, extended in place."""

    def __init__(
        self,
        planner_url: str,
        start: Callable[[NodePlan], Child],
        nodes: list[NodePlan],
        children: list[Child],
        on_change: Callable[[], None],
    ) -> None:
        self.planner_url = planner_url.rstrip("/")
        self._start_node = start
        self.nodes = nodes
        self.children = children
        self._on_change = on_change
        self.draining: set[str] = set()
        self._http = httpx.Client(timeout=2.0, trust_env=False)
        self._last_at: float | None = None
        self._next_check = 0.0

    def step(self) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_S
        status = self._status()
        if status is not None:
            self.follow(status)

    def follow(self, status: PlannerStatus) -> None:
        """Act on one decision of the planner (once: the same decision again is ignored)."""
        if status.at == self._last_at:
            return
        self._last_at = status.at
        for pool in POOLS:
            if pool in status.pools:
                self._follow(pool, status.pools[pool])

    def close(self) -> None:
        self._http.close()

    def _status(self) -> PlannerStatus | None:
        try:
            resp = self._http.get(self.planner_url + "/status")
            if resp.status_code != 200:
                return None
            return PlannerStatus.model_validate_json(resp.content)
        except (httpx.HTTPError, ValidationError):
            return None

    def _follow(self, pool: str, wanted: PoolStatus) -> None:
        mine = self._active(pool)
        count = len((set(wanted.nodes) - self.draining) | set(mine))
        for _ in range(wanted.desired - count):
            self._start(pool)
        if wanted.desired < count:
            newest_first = sorted(mine, key=_index, reverse=True)
            idlest = sorted(newest_first, key=lambda name: wanted.nodes.get(name, 0))
            for name in idlest[: count - wanted.desired]:
                self._drain(mine[name], wanted.reason)

    def _active(self, pool: str) -> dict[str, Child]:
        """This launcher's nodes of `pool` that run and are not draining."""
        roles = {n.name: n.role for n in self.nodes}
        return {
            c.name: c
            for c in self.children
            if roles.get(c.name) == pool and c.exit_code() is None and c.name not in self.draining
        }

    def _start(self, pool: str) -> None:
        used = [_index(n.name) for n in self.nodes if n.role == pool]
        plan = NodePlan.bound(f"{pool}-{max(used, default=-1) + 1}", pool, pool)
        child = self._start_node(plan)
        self.nodes.append(plan)
        self.children.append(child)
        print(f"planner: started {plan.name} pid={child.pid} {plan.url}", flush=True)
        self._on_change()

    def _drain(self, child: Child, reason: str) -> None:
        child.signal(signal.SIGTERM)
        self.draining.add(child.name)
        print(f"planner: draining {child.name} ({reason})", flush=True)
        self._on_change()


def _index(name: str) -> int:
    found = re.search(r"-(\d+)$", name)
    return int(found.group(1)) if found else -1
