"""What the planner decided, as it travels: published in Redis (the router's dashboard reads
it) and at the planner's GET /status (the launcher of `splitserve up --planner` acts on it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from cluster.registry import DEFAULT_NAMESPACE


def status_key(namespace: str = DEFAULT_NAMESPACE) -> str:
    return f"{namespace}:planner:status"


class PoolStatus(BaseModel):
    """One pool: the registry's replicas now, those still starting, the planner's wish and
    why."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    current: int = Field(ge=0)
    desired: int = Field(ge=0)
    starting: int = Field(default=0, ge=0)  # asked for, not in the registry yet (loading)
    floor: int = Field(default=0, ge=0)  # nodes the running requests need
    load: float = 0.0  # prefill: prompt tokens/s; decode: sequences
    predicted: float = 0.0
    capacity: float | None = None  # per node at the target, once learned
    reason: str = ""
    direction: str | None = None  # "up" / "down" on the tick that changed it
    nodes: dict[str, int] = Field(default_factory=dict)  # node id -> running requests


class PlannerStatus(BaseModel):
    """One tick of the planner. `at`: the planner's unix time; latencies in seconds."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    at: float
    interval_s: float
    source_ok: bool
    ttft_target_s: float
    itl_target_s: float
    ttft_s: float | None = None
    itl_s: float | None = None
    requests_per_s: float = 0.0
    pools: dict[str, PoolStatus] = Field(default_factory=dict)
