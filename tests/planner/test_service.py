"""The planner process against a real (embedded) Redis: it counts every node in the registry,
whoever registered it, holds its decision while the metrics are unreachable, and publishes
the decision where the router's dashboard reads it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence

import pytest

from cluster.node_records import NodeInfo, NodeLoad, NodeRecord
from cluster.planner_status import PlannerStatus, status_key
from cluster.registry import Membership, NodeRegistry
from launcher.redis_server import EmbeddedRedis
from planner.config import PlannerConfig
from planner.observation import Sample
from planner.planner import Planner
from planner.service import PlannerService


class _Source:
    def __init__(self) -> None:
        self.up = True

    async def read(self, nodes: Sequence[NodeRecord]) -> tuple[Sample, ...] | None:
        return () if self.up else None


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 5.0
        return self.now


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as srv:
        yield srv


@pytest.fixture
async def members(server: EmbeddedRedis) -> AsyncIterator[Membership]:
    m = Membership(server.url, poll_s=60)
    await m.start()
    yield m
    await m.stop()


async def _register(url: str, node_id: str, role: str, running: int = 0) -> NodeRegistry:
    reg = NodeRegistry(url, ttl_s=60)
    info = NodeInfo(
        node_id=node_id, role=role, url="http://127.0.0.1:1", model="m", layout_fingerprint="f",
        max_model_len=64, capacity=8, started_at=0.0,
    )  # fmt: skip
    await reg.register(info, NodeLoad(running=running))
    return reg


async def test_every_registered_node_counts_and_the_decision_is_published(
    server: EmbeddedRedis, members: Membership
) -> None:
    regs = [
        await _register(server.url, "prefill-0", "prefill"),
        await _register(server.url, "someone-elses", "prefill", running=2),
        await _register(server.url, "decode-0", "decode"),
    ]
    source = _Source()
    config = PlannerConfig(interval_s=5.0)
    service = PlannerService(Planner(config), members, source, clock=_Clock())
    await service.tick()
    status = await service.tick()
    assert status.pools["prefill"].current == 2
    assert status.pools["prefill"].nodes == {"prefill-0": 0, "someone-elses": 2}
    assert members.redis is not None
    stored = PlannerStatus.model_validate_json(await members.redis.get(status_key()))
    assert stored == status
    source.up = False
    held = await service.tick()
    assert not held.source_ok and held.pools["prefill"].reason == "source_unreachable"
    assert held.pools["prefill"].desired == status.pools["prefill"].desired
    body, _ = service.metrics.render()
    assert b"splitserve_planner_source_up 0.0" in body
    for reg in regs:
        await reg.close()
