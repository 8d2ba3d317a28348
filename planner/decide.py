"""One pool's decision: replicas from the predicted load, the pool's capacity and its latency
target, damped by hysteresis and cool-downs.

The decision is always taken from the replicas the registry shows now (every node, whoever
started it), never from the planner's own count: a node started or stopped by hand is
simply part of the next decision. Only the cool-downs and the scale-down streak are state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


class PoolDecider:
    """Holds one pool's cool-downs and scale-down streak."""

    def __init__(self, slo_name: str, limits: PoolLimits, config: PlannerConfig) -> None:
        self.slo_name = slo_name  # "ttft" or "itl": names the reason
        self.limits = limits
        self.config = config
        self.last: int | None = None
        self.up_ready_at = 0.0
        self.down_ready_at = 0.0
        self.hold_until = 0.0
        self.streak = 0

    def hold(self, replicas: int, reason: str) -> PoolDecision:
        """No new information (metrics unreachable, first tick): keep the last decision."""
        desired = self.last if self.last is not None else self.limits.clamp(replicas)
        self.last = desired
        return PoolDecision(desired, reason)

    def decide(self, x: PoolInputs, now: float) -> PoolDecision:
        lowest = min(self.limits.max_replicas, max(self.limits.min_replicas, x.floor))
        wanted, why = self._wanted_up(x)
        if wanted > x.replicas and now >= self.up_ready_at:
            return self._change(wanted, why, "up", now)
        if x.replicas < lowest:
            return self._change(lowest, "floor" if x.floor > x.replicas else "min", "up", now)
        if x.replicas > self.limits.max_replicas:
            return self._change(self.limits.max_replicas, "max", "down", now)
        if now < self.hold_until and self.last is not None:
            self.streak = 0
            return self._keep(max(lowest, min(self.last, self.limits.max_replicas)), "cooldown")
        if x.replicas - 1 >= lowest and self._fits_smaller(x):
            self.streak += 1
            if self.streak >= self.config.scale_down_intervals and now >= self.down_ready_at:
                return self._change(x.replicas - 1, "load_fell", "down", now)
            # a shrink decided earlier and not carried out yet still stands while it fits
            pending = self.last if self.last is not None and self.last < x.replicas else None
            desired = x.replicas if pending is None else max(lowest, pending)
            return self._keep(desired, "scale_down_pending")
        self.streak = 0
        return self._keep(x.replicas, "steady")

    def _wanted_up(self, x: PoolInputs) -> tuple[int, str]:
        wanted, why = 0, "load"
        if x.capacity is not None and x.capacity > 0:
            wanted = math.ceil(x.predicted / (x.capacity * self.config.scale_up_utilization))
        missed = x.slo_ratio is not None and x.slo_ratio > 1 and x.load > 0 and x.contended
        if missed and x.replicas + 1 > wanted:
            wanted, why = x.replicas + 1, f"{self.slo_name}_over_target"
        return min(wanted, self.limits.max_replicas), why

    def _fits_smaller(self, x: PoolInputs) -> bool:
        room = (x.replicas - 1) * self.config.scale_down_utilization
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
