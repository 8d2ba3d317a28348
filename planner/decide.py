"""One pool's decision: replicas from the predicted load, the pool's capacity and its latency
target, damped by hysteresis and cool-downs.

The decision is taken from the replicas the registry shows now (every node, whoever started
it): a node started or stopped by hand is simply part of the next decision. The one count of
its own is the nodes its last scale-up asked for: a node registers only once it has loaded,
so until the registry shows them (or `start_timeout_s` passed) they count as replicas
starting, and the pool neither shrinks nor grows on a missed target meanwhile. The
cool-downs and the scale-down streak are the other state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from planner.config import PlannerConfig, PoolLimits


@dataclass(frozen=True)
class PoolInputs:
    replicas: int  # nodes of the pool in the registry now
    load: float  # in the pool's unit: prompt tokens/s (prefill), sequences (decode)
    predicted: float
    peak: float  # the highest load of the recent intervals
    capacity: float | None  # per node at the target; None until learned
    proven: float  # per node, handled within target
    slo_ratio: float | None  # the latency quantile over its target; None without requests
    floor: int  # nodes the running requests need
    # requests wait for a node or share one: more nodes would shorten the latency (a missed
    # target without it means the requests are slow on any node; more nodes would not help)
    contended: bool = True


@dataclass(frozen=True)
class PoolDecision:
    desired: int
    reason: str
    direction: str | None = None  # "up" or "down" when this tick changed the replicas
    starting: int = 0  # nodes asked for and not in the registry yet


class PoolDecider:
    """Holds one pool's cool-downs, scale-down streak and the replicas its last scale-up asked
    for (until the registry shows them)."""

    def __init__(self, slo_name: str, limits: PoolLimits, config: PlannerConfig) -> None:
        self.slo_name = slo_name  # "ttft" or "itl": names the reason
        self.limits = limits
        self.config = config
        self.last: int | None = None
        self.up_ready_at = 0.0
        self.down_ready_at = 0.0
        self.hold_until = 0.0
        self.streak = 0
        self.asked = 0  # the replicas of the last scale-up, until the registry shows them
        self.asked_until = 0.0

    def hold(self, replicas: int, reason: str) -> PoolDecision:
        """No new information (metrics unreachable, first tick): keep the last decision."""
        desired = self.last if self.last is not None else self.limits.clamp(replicas)
        self.last = desired
        return PoolDecision(desired, reason, starting=max(0, self.asked - replicas))

    def decide(self, x: PoolInputs, now: float) -> PoolDecision:
        starting = self._starting(x.replicas, now)
        decision = self._decide(x, x.replicas + starting, starting > 0, now)
        return replace(decision, starting=max(0, self.asked - x.replicas))

    def _decide(self, x: PoolInputs, replicas: int, starting: bool, now: float) -> PoolDecision:
        """`replicas`: the registry's and those starting."""
        lowest = min(self.limits.max_replicas, max(self.limits.min_replicas, x.floor))
        wanted, why = self._wanted_up(x, replicas, starting)
        if wanted > replicas and now >= self.up_ready_at:
            return self._change(wanted, why, "up", now)
        if replicas < lowest:
            return self._change(lowest, "floor" if x.floor > replicas else "min", "up", now)
        if replicas > self.limits.max_replicas:
            return self._change(self.limits.max_replicas, "max", "down", now)
        if now < self.hold_until and self.last is not None:
            self.streak = 0
            return self._keep(max(lowest, min(self.last, self.limits.max_replicas)), "cooldown")
        if starting:
            self.streak = 0
            return self._keep(replicas, "starting")
        if replicas - 1 >= lowest and self._fits_smaller(x, replicas):
            self.streak += 1
            if self.streak >= self.config.scale_down_intervals and now >= self.down_ready_at:
                return self._change(replicas - 1, "load_fell", "down", now)
            # a shrink decided earlier and not carried out yet still stands while it fits
            pending = self.last if self.last is not None and self.last < replicas else None
            desired = replicas if pending is None else max(lowest, pending)
            return self._keep(desired, "scale_down_pending")
        self.streak = 0
        return self._keep(replicas, "steady")

    def _starting(self, registered: int, now: float) -> int:
        """Nodes the last scale-up asked for that the registry does not show yet. Once it
        shows them, the down cool-down starts over: a node serves a while before it goes."""
        if self.asked > registered and now < self.asked_until:
            return self.asked - registered
        if 0 < self.asked <= registered:
            self.down_ready_at = max(self.down_ready_at, now + self.config.down_cooldown_s)
        self.asked = 0
        return 0

    def _wanted_up(self, x: PoolInputs, replicas: int, starting: bool) -> tuple[int, str]:
        wanted, why = 0, "load"
        if x.capacity is not None and x.capacity > 0:
            wanted = math.ceil(x.predicted / (x.capacity * self.config.scale_up_utilization))
        # the latency was measured without the nodes still starting: no more on it meanwhile
        missed = x.slo_ratio is not None and x.slo_ratio > 1 and x.load > 0 and x.contended
        if missed and not starting and replicas + 1 > wanted:
            wanted, why = replicas + 1, f"{self.slo_name}_over_target"
        return min(wanted, self.limits.max_replicas), why

    def _fits_smaller(self, x: PoolInputs, replicas: int) -> bool:
        room = (replicas - 1) * self.config.scale_down_utilization
        per_node = x.capacity if x.capacity is not None else 0.0
        per_node = max(per_node, x.proven)
        fits = max(x.load, x.predicted, x.peak) <= room * per_node
        calm = x.slo_ratio is None or x.slo_ratio < self.config.scale_down_slo_ratio
        return fits and calm

    def _change(self, desired: int, reason: str, direction: str, now: float) -> PoolDecision:
        cfg = self.config
        if direction == "up":
            self.up_ready_at = now + cfg.up_cooldown_s
            self.hold_until = now + cfg.up_cooldown_s
            self.asked, self.asked_until = desired, now + cfg.start_timeout_s
        else:
            self.hold_until = now + cfg.down_cooldown_s
        self.down_ready_at = now + cfg.down_cooldown_s
        self.streak = 0
        changed = desired != self.last
        self.last = desired
        return PoolDecision(desired, reason, direction if changed else None)

    def _keep(self, desired: int, reason: str) -> PoolDecision:
        self.last = desired
        return PoolDecision(desired, reason)
