"""Each pool's capacity per node, learned from what the nodes did.

Prefill: prompt tokens per second one node gets through. An interval in which the pool kept
a queue shows the node's limit: tokens processed (accepted, less what the queue grew by) per
node. Decode: sequences one node runs at the ITL target. An
interval that missed the target with R sequences per node shows R * target / ITL (a decode
step costs about in proportion to its batch, as far as the planner needs).

Intervals within target show only that a node handles at least that much (`proven`); the
planner shrinks a pool on that alone, and grows it on the latency target until it has seen
a limit (`estimate`).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.observation import Observation

SMOOTHING = 0.3  # weight of a new limit sample in the running estimate


@dataclass
class Capacity:
    """Per node, in the pool's load unit."""

    estimate: float | None = None  # the limit, from saturated intervals
    proven: float = 0.0  # the most handled within target

    def saturated(self, per_node: float) -> None:
        if per_node <= 0:
            return
        if self.estimate is None:
            self.estimate = per_node
        else:
            self.estimate += SMOOTHING * (per_node - self.estimate)

    def within_target(self, per_node: float) -> None:
        self.proven = max(self.proven, per_node)

    def at_target(self) -> float | None:
        """The capacity to size the pool by (None: not learned yet)."""
        if self.estimate is None:
            return None
        return max(self.estimate, self.proven)

    def for_scale_down(self) -> float:
        """The capacity a smaller pool can count on."""
        return max(self.estimate or 0.0, self.proven)


def learn_prefill(cap: Capacity, obs: Observation, ttft_slo_s: float) -> None:
    pool = obs.pools["prefill"]
    if pool.replicas == 0 or not pool.same_nodes:  # a node came or went: rates are partial
        return
    backlog_growth = (pool.waiting - pool.waiting_before) * pool.tokens_per_request / obs.dt
    per_node = max(0.0, pool.tokens_per_s - backlog_growth) / pool.replicas
    queued = pool.waiting > 0 and pool.waiting_before > 0
    missed = obs.ttft_s is not None and obs.ttft_s > ttft_slo_s
    if queued and pool.tokens_per_s > 0:
        cap.saturated(per_node)
    elif obs.ttft_s is not None and not missed:
        cap.within_target(per_node)
    # a target missed without a queue says the prompts are slow, not how many a node takes


def learn_decode(cap: Capacity, obs: Observation, itl_slo_s: float) -> None:
    pool = obs.pools["decode"]
    if pool.replicas == 0 or pool.running == 0 or obs.itl_s is None or not pool.same_nodes:
        return
    per_node = pool.running / pool.replicas
    if obs.itl_s > itl_slo_s:
        cap.saturated(per_node * itl_slo_s / obs.itl_s)
    else:
        cap.within_target(per_node)
