"""The planner's tick: a scrape in, one decision per pool out (as the `PlannerStatus` that the
metrics, Redis and the launcher share)."""

from __future__ import annotations

import math

from cluster.planner_status import PlannerStatus, PoolStatus
from planner.capacity import Capacity, learn_decode, learn_prefill
from planner.config import POOLS, PlannerConfig
from planner.decide import PoolDecider, PoolDecision, PoolInputs
from planner.observation import Observation, PoolObservation, Scrape, observe
from planner.predict import TrendPredictor


class Planner:
    """Feed it one `Scrape` per interval (`tick`); the clock is the scrapes' `at`."""

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self.capacity = {pool: Capacity() for pool in POOLS}
        self.predictors = {
            pool: TrendPredictor(config.history_intervals, config.horizon_intervals)
            for pool in POOLS
        }
        self.deciders = {
            "prefill": PoolDecider("ttft", config.prefill, config),
            "decode": PoolDecider("itl", config.decode, config),
        }
        self.busiest = dict.fromkeys(POOLS, 1)  # most requests one node was seen running
        self._last_good: Scrape | None = None

    def tick(self, scrape: Scrape) -> PlannerStatus:
        if scrape.samples is None:
            return self._hold(scrape, None, "source_unreachable")
        before, self._last_good = self._last_good, scrape
        if before is None or scrape.at <= before.at:
            return self._hold(scrape, None, "warming_up")
        obs = observe(before, scrape, self.config.quantile)
        learn_prefill(self.capacity["prefill"], obs, self.config.ttft_slo_s)
        learn_decode(self.capacity["decode"], obs, self.config.itl_slo_s)
        pools = {}
        for pool in POOLS:
            inputs = self._inputs(pool, obs)
            decision = self.deciders[pool].decide(inputs, scrape.at)
            pools[pool] = self._pool_status(scrape, pool, inputs, decision)
        return self._status(scrape, obs, pools)

    def _inputs(self, pool: str, obs: Observation) -> PoolInputs:
        seen = obs.pools[pool]
        self.busiest[pool] = max(self.busiest[pool], seen.busiest)
        load = _load(pool, seen, obs.dt)
        predictor = self.predictors[pool]
        predictor.add(load)
        latency = obs.ttft_s if pool == "prefill" else obs.itl_s
        cap = self.capacity[pool]
        return PoolInputs(
            replicas=seen.replicas,
            load=load,
            predicted=predictor.predict(),
            peak=predictor.peak(),
            capacity=cap.at_target(),
            proven=cap.proven,
            slo_ratio=None if latency is None else latency / self.config.slo_s(pool),
            floor=math.ceil(seen.running / self.busiest[pool]),
            contended=_contended(pool, seen),
        )

    def _hold(self, scrape: Scrape, obs: Observation | None, reason: str) -> PlannerStatus:
        pools = {}
        for pool in POOLS:
            replicas = len(scrape.pool(pool))
            decision = self.deciders[pool].hold(replicas, reason)
            cap = self.capacity[pool].at_target()
            inputs = PoolInputs(replicas, 0.0, 0.0, 0.0, cap, 0.0, None, 0)
            pools[pool] = self._pool_status(scrape, pool, inputs, decision)
        return self._status(scrape, obs, pools)

    def _pool_status(
        self, scrape: Scrape, pool: str, x: PoolInputs, decision: PoolDecision
    ) -> PoolStatus:
        return PoolStatus(
            current=x.replicas,
            desired=decision.desired,
            starting=decision.starting,
            floor=x.floor,
            load=x.load,
            predicted=x.predicted,
            capacity=x.capacity,
            reason=decision.reason,
            direction=decision.direction,
            nodes={n.node_id: n.running for n in scrape.pool(pool)},
        )

    def _status(
        self, scrape: Scrape, obs: Observation | None, pools: dict[str, PoolStatus]
    ) -> PlannerStatus:
        return PlannerStatus(
            at=scrape.at,
            interval_s=self.config.interval_s,
            source_ok=scrape.samples is not None,
            ttft_target_s=self.config.ttft_slo_s,
            itl_target_s=self.config.itl_slo_s,
            ttft_s=obs.ttft_s if obs else None,
            itl_s=obs.itl_s if obs else None,
            requests_per_s=obs.requests_per_s if obs else 0.0,
            pools=pools,
        )


def _load(pool: str, seen: PoolObservation, dt: float) -> float:
    """Prefill: prompt tokens/s arriving, plus the queue's tokens to clear within an interval.
    Decode: sequences running or waiting."""
    if pool == "prefill":
        return seen.tokens_per_s + seen.waiting * seen.tokens_per_request / dt
    return float(seen.running + seen.waiting)


def _contended(pool: str, seen: PoolObservation) -> bool:
    """Prefill: prompts waited for a node. Decode: a node shares its steps among sequences."""
    if pool == "prefill":
        return seen.waiting > 0 or seen.waiting_before > 0
    return seen.busiest > 1 or seen.waiting > 0
