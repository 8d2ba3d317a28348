"""The planner's settings: one frozen dataclass, checked at construction."""

from __future__ import annotations

from dataclasses import dataclass

POOLS = ("prefill", "decode")


@dataclass(frozen=True)
class PoolLimits:
    """Replicas of one pool lie in [min_replicas, max_replicas]."""

    min_replicas: int = 1
    max_replicas: int = 4

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError(f"min replicas must be >= 0, got {self.min_replicas}")
        if self.max_replicas < max(1, self.min_replicas):
            raise ValueError(
                f"max replicas ({self.max_replicas}) must be >= 1 and >= min ({self.min_replicas})"
            )

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class PlannerConfig:
    """Targets, limits and the damping of decisions.

    A pool grows when its predicted load passes `scale_up_utilization` of its capacity or
    its latency target is missed; it shrinks by one node only when the load would stay under
    `scale_down_utilization` of the smaller pool's capacity (and the latency well under
    target: `scale_down_slo_ratio`) for `scale_down_intervals` intervals in a row. After
    a change, `up_cooldown_s` / `down_cooldown_s` pass before the next one the same way
    (a scale-up may always follow a scale-down's cool-down). The nodes a scale-up asked for
    count as replicas until the registry shows them, for up to `start_timeout_s` (a node
    slower than that is taken to have failed); the down cool-down counts from their arrival.
    """

    ttft_slo_s: float = 1.0
    itl_slo_s: float = 0.1
    prefill: PoolLimits = PoolLimits()
    decode: PoolLimits = PoolLimits()
    interval_s: float = 5.0
    horizon_intervals: int = 2  # how far ahead the load is predicted
    history_intervals: int = 6  # intervals the trend is fitted on
    scale_up_utilization: float = 0.8
    scale_down_utilization: float = 0.5
    scale_down_slo_ratio: float = 0.6
    scale_down_intervals: int = 3
    up_cooldown_s: float = 30.0
    down_cooldown_s: float = 60.0
    start_timeout_s: float = 300.0
    quantile: float = 0.9

    def __post_init__(self) -> None:
        positive = {
            "ttft_slo_s": self.ttft_slo_s,
            "itl_slo_s": self.itl_slo_s,
            "interval_s": self.interval_s,
            "start_timeout_s": self.start_timeout_s,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if not 0 < self.scale_down_utilization < self.scale_up_utilization <= 1:
            raise ValueError(
                "need 0 < scale_down_utilization < scale_up_utilization <= 1, got "
                f"{self.scale_down_utilization} and {self.scale_up_utilization}"
            )
        if not 0 < self.scale_down_slo_ratio < 1:
            raise ValueError(
                f"scale_down_slo_ratio must be in (0, 1), got {self.scale_down_slo_ratio}"
            )
        if self.horizon_intervals < 0 or self.history_intervals < 2:
            raise ValueError("horizon_intervals must be >= 0 and history_intervals >= 2")
        if self.scale_down_intervals < 1:
            raise ValueError(f"scale_down_intervals must be >= 1, got {self.scale_down_intervals}")
        if self.up_cooldown_s < 0 or self.down_cooldown_s < 0:
            raise ValueError("cool-downs must be >= 0")
        if not 0 < self.quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {self.quantile}")

    def limits(self, pool: str) -> PoolLimits:
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
        return self.prefill if pool == "prefill" else self.decode

    def slo_s(self, pool: str) -> float:
        """The latency target a pool answers for: TTFT for prefill, ITL for decode."""
        return self.ttft_slo_s if pool == "prefill" else self.itl_slo_s
