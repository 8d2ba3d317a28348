"""The planner's settings: one frozen dataclass, checked at construction (config_kit)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from config_kit import Helm, Up, check_fields, setting

POOLS = ("prefill", "decode")
# `up --planner` and the chart set these from flags and keys of their own
_own = partial(setting, up=Up.OWN, helm=Helm.CHART)


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

    The fields declared with `setting(...)` are `splitserve planner`'s flags and variables;
    `splitserve up --planner` sets them from its own planner flags, the chart from its
    planner keys.
    """

    ttft_slo_ms: float = _own(1000.0, "TTFT target (p90), in ms", gt=0)
    itl_slo_ms: float = _own(100.0, "ITL target (p90), in ms", gt=0)
    min_prefill: int = _own(1, "fewest prefill nodes", ge=0)
    max_prefill: int = _own(4, "most prefill nodes", ge=1)
    min_decode: int = _own(1, "fewest decode nodes", ge=0)
    max_decode: int = _own(4, "most decode nodes", ge=1)
    interval_s: float = _own(5.0, "seconds between decisions", gt=0)
    horizon_intervals: int = _own(2, "predict this far ahead, in intervals", ge=0)
    history_intervals: int = 6  # intervals the trend is fitted on
    scale_up_utilization: float = 0.8
    scale_down_utilization: float = 0.5
    scale_down_slo_ratio: float = 0.6
    scale_down_intervals: int = _own(
        3, "intervals in a row a smaller pool must fit before one node goes", ge=1
    )
    up_cooldown_s: float = _own(30.0, "after a scale-up, seconds before the next change", ge=0)
    down_cooldown_s: float = _own(60.0, "after a scale-down, seconds before the next one", ge=0)
    start_timeout_s: float = _own(
        300.0, "how long the nodes a scale-up asked for count as replicas before they register",
        gt=0,
    )  # fmt: skip
    quantile: float = 0.9

    def __post_init__(self) -> None:
        check_fields(self)
        self.check_relations(self)
        if not 0 < self.scale_down_utilization < self.scale_up_utilization <= 1:
            raise ValueError(
                "need 0 < scale_down_utilization < scale_up_utilization <= 1, got "
                f"{self.scale_down_utilization} and {self.scale_up_utilization}"
            )
        if not 0 < self.scale_down_slo_ratio < 1:
            raise ValueError(
                f"scale_down_slo_ratio must be in (0, 1), got {self.scale_down_slo_ratio}"
            )
        if self.history_intervals < 2:
            raise ValueError("history_intervals must be >= 2")
        if not 0 < self.quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {self.quantile}")

    @staticmethod
    def check_relations(config: Any) -> None:
        """ValueError naming a pool whose most is below its fewest."""
        PoolLimits(config.min_prefill, config.max_prefill)
        PoolLimits(config.min_decode, config.max_decode)

    @property
    def ttft_slo_s(self) -> float:
        return self.ttft_slo_ms / 1000

    @property
    def itl_slo_s(self) -> float:
        return self.itl_slo_ms / 1000

    @property
    def prefill(self) -> PoolLimits:
        return PoolLimits(self.min_prefill, self.max_prefill)

    @property
    def decode(self) -> PoolLimits:
        return PoolLimits(self.min_decode, self.max_decode)

    def limits(self, pool: str) -> PoolLimits:
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
        return self.prefill if pool == "prefill" else self.decode

    def slo_s(self, pool: str) -> float:
        """The latency target a pool answers for: TTFT for prefill, ITL for decode."""
        return self.ttft_slo_s if pool == "prefill" else self.itl_slo_s
