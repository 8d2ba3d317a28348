"""What each interval teaches about a pool's capacity: a queue shows the prefill limit, a
missed ITL target the decode limit; a slow prompt without a queue, or a node joining, teaches
nothing; intervals within target only prove a floor."""

from __future__ import annotations

import pytest

from planner.capacity import Capacity, learn_decode, learn_prefill
from planner.observation import Observation, PoolObservation


def _obs(
    prefill: PoolObservation, ttft: float | None = None, itl: float | None = None
) -> Observation:
    decode = PoolObservation(replicas=1, running=0, waiting=0, busiest=0)
    return Observation(at=10, dt=5, pools={"prefill": prefill, "decode": decode},
                       ttft_s=ttft, itl_s=itl)  # fmt: skip


def _prefill(**kw: object) -> PoolObservation:
    base: dict[str, object] = dict(replicas=2, running=2, waiting=0, busiest=1,
                                   tokens_per_s=1000.0, tokens_per_request=100.0)  # fmt: skip
    return PoolObservation(**(base | kw))  # type: ignore[arg-type]


def test_a_queue_shows_the_prefill_limit() -> None:
    cap = Capacity()
    # 1000 tokens/s accepted, the queue grew from 4 to 9 requests of 100 tokens in 5 s
    learn_prefill(cap, _obs(_prefill(waiting=9, waiting_before=4), ttft=3.0), ttft_slo_s=1.0)
    assert cap.estimate == pytest.approx((1000 - 100) / 2)


def test_slow_prompts_without_a_queue_and_changing_nodes_teach_nothing() -> None:
    cap = Capacity()
    learn_prefill(cap, _obs(_prefill(), ttft=3.0), ttft_slo_s=1.0)
    learn_prefill(cap, _obs(_prefill(waiting=5, waiting_before=5, same_nodes=False)), 1.0)
    assert cap.estimate is None and cap.proven == 0
    learn_prefill(cap, _obs(_prefill(), ttft=0.2), ttft_slo_s=1.0)
    assert cap.estimate is None and cap.proven == 500  # within target: at least this much


def test_a_missed_itl_target_shows_the_decode_limit() -> None:
    cap = Capacity()
    decode = PoolObservation(replicas=2, running=16, waiting=0, busiest=8)
    obs = Observation(at=10, dt=5, pools={"prefill": _prefill(), "decode": decode}, itl_s=0.2)
    learn_decode(cap, obs, itl_slo_s=0.1)
    assert cap.estimate == pytest.approx(4.0)  # 8 per node at twice the target
    calm = Observation(at=15, dt=5, pools={"prefill": _prefill(), "decode": decode}, itl_s=0.05)
    learn_decode(cap, calm, itl_slo_s=0.1)
    assert cap.proven == 8 and cap.at_target() == 8  # the larger of limit and proven
