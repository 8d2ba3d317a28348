"""Registry and membership against a real (embedded) Redis."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis

from cluster.node_records import NodeInfo, NodeLoad, NodeRecord
from cluster.registry import (
    REDIS_ERRORS,
    Membership,
    NodeRegistry,
    StaticMembership,
    node_key,
)
from launcher.redis_server import EmbeddedRedis


def _info(node_id: str, role: str = "decode", url: str | None = None) -> NodeInfo:
    return NodeInfo.model_validate(
        {
            "node_id": node_id,
            "role": role,
            "url": url or f"http://127.0.0.1/{node_id}",
            "model": "m",
            "layout_fingerprint": "fp",
            "max_model_len": 128,
            "capacity": 10,
            "started_at": 0.0,
        }
    )


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as srv:
        yield srv


@pytest.fixture
async def membership(server: EmbeddedRedis) -> AsyncIterator[Membership]:
    members = Membership(server.url, poll_s=0.05)
    await members.start()
    yield members
    await members.stop()


async def _wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def _ids(members: StaticMembership) -> list[str]:
    return [r.info.node_id for r in members.nodes()]


async def test_register_heartbeat_and_deregister(
    server: EmbeddedRedis, membership: Membership
) -> None:
    node = NodeRegistry(server.url, ttl_s=5.0)
    await node.register(_info("d0"))
    assert await membership.refresh()
    assert _ids(membership) == ["d0"]
    await node.heartbeat(NodeLoad(running=3, free_blocks=7, total_blocks=10, kv_usage=0.3))
    await membership.refresh()
    assert membership.nodes()[0].load.running == 3
    await node.deregister()
    await membership.refresh()
    assert membership.nodes() == []
    await node.close()


async def test_node_that_stops_beating_expires(
    server: EmbeddedRedis, membership: Membership
) -> None:
    quiet, alive = NodeRegistry(server.url, ttl_s=0.3), NodeRegistry(server.url, ttl_s=0.3)
    await quiet.register(_info("quiet"))
    await alive.register(_info("alive", role="prefill"))
    stop = asyncio.Event()
    beats = asyncio.create_task(alive.run_heartbeats(NodeLoad, interval_s=0.05, stop=stop))
    await _wait_for(lambda: _ids(membership) == ["alive", "quiet"])
    await _wait_for(lambda: _ids(membership) == ["alive"])
    assert _ids(membership) == ["alive"]  # the quiet node expired, the beating one stayed
    stop.set()
    await asyncio.wait_for(beats, 5)
    await quiet.close()
    await alive.close()


@contextlib.asynccontextmanager
async def _ready_endpoint(body: dict[str, object]) -> AsyncIterator[str]:
    """A node's /ready answering `body` (read at each call) with 503; its base URL."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        payload = json.dumps(body).encode()
        head = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        writer.write(head.encode() + payload)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def test_a_node_cut_off_from_redis_alone_stays_while_it_serves(
    server: EmbeddedRedis, membership: Membership
) -> None:
    """Redis out of a node's reach (not the router's): its key expires, but its /ready says
    it serves, so the router keeps it; once it drains, it goes."""
    body: dict[str, object] = {"status": "not_ready", "registered": False, "serving": True}
    async with _ready_endpoint(body) as url:
        node = NodeRegistry(server.url, ttl_s=0.3)
        await node.register(_info("d0", url=url))
        await _wait_for(lambda: _ids(membership) == ["d0"])
        check = redis.Redis.from_url(server.url)
        try:
            await _wait_for(lambda: not check.exists(node_key("d0")))
        finally:
            check.close()
        for _ in range(3):  # polls after the key expired
            assert await membership.refresh()
            assert _ids(membership) == ["d0"]
        body.update(status="draining", serving=False)
        await _wait_for(lambda: _ids(membership) == [])
        await node.close()


async def test_membership_survives_redis_outage_and_resyncs(server: EmbeddedRedis) -> None:
    members = Membership(server.url, poll_s=0.05, resync_s=0.5)
    await members.start()
    node = NodeRegistry(server.url, ttl_s=1.0)
    gone = NodeRegistry(server.url, ttl_s=1.0)
    await node.register(_info("d0"))
    await gone.register(_info("d1"))
    stop = asyncio.Event()
    beats = asyncio.create_task(node.run_heartbeats(NodeLoad, interval_s=0.05, stop=stop))
    await _wait_for(lambda: _ids(members) == ["d0", "d1"])

    server.stop()  # Redis dies: the router keeps the last known nodes
    await _wait_for(lambda: not members.redis_ok)
    await asyncio.sleep(0.3)
    assert _ids(members) == ["d0", "d1"]
    assert not await members.refresh()

    restarted = EmbeddedRedis(port=server.port).start()  # empty: no persistence
    try:
        # d0's heartbeat loop re-registers it; d1 never beats again and is dropped.
        await _wait_for(lambda: members.redis_ok and _ids(members) == ["d0"])
    finally:
        stop.set()
        await asyncio.wait_for(beats, 5)
        await members.stop()
        await node.close()
        await gone.close()
        restarted.stop()


async def test_a_restarted_empty_redis_keeps_nodes_until_they_register_again(
    server: EmbeddedRedis,
) -> None:
    members = Membership(server.url, poll_s=60, resync_s=1.0)  # refreshed by hand below
    await members.start()
    d0, d1 = NodeRegistry(server.url, ttl_s=30), NodeRegistry(server.url, ttl_s=30)
    try:
        await d0.register(_info("d0"))
        await d1.register(_info("d1"))
        assert await members.refresh() and _ids(members) == ["d0", "d1"]
        server.stop()
        server.start()  # same port, empty, between two polls
        # The first call on a stale connection fails; the client reconnects on the next.
        assert [await members.refresh() for _ in range(2)][-1]  # Redis answers: no node
        assert _ids(members) == ["d0", "d1"]  # kept: they have not had a chance to beat
        for _ in range(3):  # the client of a registry reconnects after one failed call
            with contextlib.suppress(*REDIS_ERRORS):
                await d0.register(_info("d0"))
        await _wait_for(lambda: members.redis_ok)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while _ids(members) != ["d0"]:  # d1 never came back: dropped after resync_s
            assert loop.time() < deadline, _ids(members)
            await members.refresh()
            await asyncio.sleep(0.05)
    finally:
        await members.stop()
        await d0.close()
        await d1.close()


async def test_start_without_redis_is_tolerated() -> None:
    with EmbeddedRedis() as srv:
        url = srv.url
    members = Membership(url, poll_s=0.05)
    await members.start()  # Redis is gone: no exception, no nodes
    assert members.nodes() == [] and not members.redis_ok
    await members.stop()


async def test_unhealthy_mark_holds_until_next_heartbeat(
    server: EmbeddedRedis, membership: Membership
) -> None:
    node = NodeRegistry(server.url, ttl_s=5.0)
    await node.register(_info("d0"))
    await membership.refresh()
    membership.mark_unhealthy("d0")
    assert membership.nodes() == [] and len(membership.all_nodes()) == 1
    await membership.refresh()
    assert membership.nodes() == []  # same heartbeat: still hidden
    await node.heartbeat(NodeLoad())
    await membership.refresh()
    assert _ids(membership) == ["d0"]
    await node.close()


def test_static_membership_marks_and_updates() -> None:
    rec = NodeRecord(info=_info("p0", role="prefill"), heartbeat_at=1.0)
    members = StaticMembership([rec])
    members.mark_unhealthy("p0")
    members.mark_unhealthy("unknown")  # ignored
    assert members.nodes() == []
    members.update([rec.model_copy(update={"heartbeat_at": 2.0})])
    assert _ids(members) == ["p0"]
    members.update([])
    assert members.all_nodes() == []
