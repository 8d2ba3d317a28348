"""The router's prefix index fed by nodes' KV event streams, through a real (embedded) Redis:
stores and evictions arrive, a node that leaves is dropped, a Redis restart and lost
messages are repaired by snapshots."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from cluster.kv_event_reader import KVEventReader
from cluster.kv_events import CacheChanges, KVEventPublisher, stream_key
from launcher.redis_server import EmbeddedRedis
from models.block_hash import prefix_block_hashes
from router.routing.prefix_index import PrefixIndex, PrefixQuery

BS = 4
PROMPT = list(range(100, 113))  # 3 full blocks
HASHES = prefix_block_hashes(PROMPT, BS)


class FakeCache:
    """A node's prefix cache as the publisher sees it: a snapshot and a change log."""

    def __init__(self) -> None:
        self.blocks: dict[int, int | None] = {}
        self.stored: list[tuple[int, int | None]] = []
        self.removed: list[int] = []

    def store(self, hashes: list[int]) -> None:
        for parent, h in zip([None, *hashes[:-1]], hashes, strict=True):
            self.blocks[h] = parent
            self.stored.append((h, parent))

    def evict(self, hashes: list[int]) -> None:
        for h in hashes:
            self.blocks.pop(h, None)
            self.removed.append(h)

    async def drain(self) -> CacheChanges:
        out = CacheChanges(self.stored, self.removed)
        self.stored, self.removed = [], []
        return out

    async def snapshot(self) -> list[tuple[int, int | None]]:
        self.stored, self.removed = [], []
        return list(self.blocks.items())


class Node:
    def __init__(self, url: str, node_id: str, incarnation: str = "i1") -> None:
        self.cache = FakeCache()
        self.publisher = KVEventPublisher(url, node_id, incarnation, BS, maxlen=100)
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(
            self.publisher.run(self.cache.drain, self.cache.snapshot, 0.02, self._stop)
        )

    async def close(self) -> None:
        self._stop.set()
        await asyncio.wait_for(self._task, 10)
        await self.publisher.close()


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as srv:
        yield srv


@pytest.fixture
async def index(server: EmbeddedRedis) -> AsyncIterator[tuple[PrefixIndex, set[str]]]:
    index, members = PrefixIndex(), {"p0", "p1"}
    reader = KVEventReader(server.url, index, lambda: members, block_s=0.05)
    await reader.start()
    yield index, members
    await reader.stop()


async def _until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Whether `predicate` came true within `timeout_s` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _matched(index: PrefixIndex) -> dict[str, int]:
    return index.matched_tokens(PrefixQuery(PROMPT), ["p0", "p1"])


async def test_stores_and_evictions_reach_the_index(
    server: EmbeddedRedis, index: tuple[PrefixIndex, set[str]]
) -> None:
    idx, _ = index
    p0, p1 = Node(server.url, "p0"), Node(server.url, "p1")
    p0.cache.store(HASHES)
    p1.cache.store(HASHES[:1])
    assert await _until(lambda: _matched(idx) == {"p0": 12, "p1": 4})
    p0.cache.evict(HASHES[1:])  # the tail goes first
    assert await _until(lambda: _matched(idx) == {"p0": 4, "p1": 4})
    p0.cache.evict(HASHES[:1])
    assert await _until(lambda: _matched(idx) == {"p0": 0, "p1": 4})
    await p0.close()
    await p1.close()


async def test_a_node_that_leaves_or_restarts_loses_its_entries(
    server: EmbeddedRedis, index: tuple[PrefixIndex, set[str]]
) -> None:
    idx, members = index
    p0, p1 = Node(server.url, "p0"), Node(server.url, "p1")
    p0.cache.store(HASHES)
    p1.cache.store(HASHES)
    assert await _until(lambda: _matched(idx) == {"p0": 12, "p1": 12})
    members.discard("p1")  # membership says p1 died
    assert await _until(lambda: "p1" not in idx.nodes())
    assert _matched(idx) == {"p0": 12, "p1": 0}
    await p0.close()
    restarted = Node(server.url, "p0", incarnation="i2")  # same id, empty cache
    assert await _until(lambda: _matched(idx)["p0"] == 0)
    await restarted.close()
    await p1.close()


async def test_a_redis_restart_is_repaired_by_a_snapshot(
    server: EmbeddedRedis, index: tuple[PrefixIndex, set[str]]
) -> None:
    idx, _ = index
    p0 = Node(server.url, "p0")
    p0.cache.store(HASHES[:2])
    assert await _until(lambda: _matched(idx)["p0"] == 8)
    server.stop()
    p0.cache.evict(HASHES[1:2])  # happens while Redis is down: the delta is lost
    await asyncio.sleep(0.2)
    assert _matched(idx)["p0"] == 8  # the router keeps what it knew
    server.start()  # empty: no persistence
    p0.cache.store(HASHES[2:])  # needs the evicted parent: matches only block 0
    assert await _until(lambda: _matched(idx)["p0"] == 4 and idx.num_blocks(["p0"]) == 2)
    await p0.close()


@dataclass
class Manual:
    """A reader polled by the test itself, a publisher driven by hand, and a raw client."""

    index: PrefixIndex
    reader: KVEventReader
    publisher: KVEventPublisher
    client: aioredis.Redis

    async def lose_last(self) -> None:
        """Delete the newest message of p0's stream before any reader sees it."""
        last = (await self.client.xrevrange(stream_key("p0"), count=1))[0][0]
        await self.client.xdel(stream_key("p0"), last)


@pytest.fixture
async def manual(server: EmbeddedRedis) -> AsyncIterator[Manual]:
    index = PrefixIndex()
    reader = KVEventReader(server.url, index, lambda: {"p0"}, block_s=0.05)
    publisher = KVEventPublisher(server.url, "p0", "i1", BS)
    client = aioredis.Redis.from_url(server.url)
    yield Manual(index, reader, publisher, client)
    await client.aclose()
    await publisher.close()
    await reader.stop()


async def test_lost_messages_are_repaired_by_the_next_snapshot(manual: Manual) -> None:
    publisher, reader, index = manual.publisher, manual.reader, manual.index
    await publisher.publish_snapshot([(h, None) for h in HASHES])
    await reader.poll()
    assert _matched(index)["p0"] == 12
    await publisher.publish(CacheChanges([], HASHES[1:]))
    await manual.lose_last()  # the eviction never reaches the router
    await publisher.publish(CacheChanges([(777, None)], []))
    await reader.poll()
    assert reader.lost == 1
    assert _matched(index)["p0"] == 12  # stale: the node will miss and compute them
    await publisher.publish_snapshot([(HASHES[0], None), (777, None)])
    await reader.poll()
    assert _matched(index)["p0"] == 4 and index.num_blocks(["p0"]) == 2


async def test_a_gap_sends_the_reader_back_to_the_latest_snapshot(
    server: EmbeddedRedis, manual: Manual
) -> None:
    publisher, reader, index = manual.publisher, manual.reader, manual.index
    await publisher.publish_snapshot([(HASHES[0], None)])
    await reader.poll()
    await publisher.publish(CacheChanges([(111, None)], []))
    await manual.lose_last()
    await publisher.publish(CacheChanges([(222, None)], []))  # read first: the gap
    await publisher.publish_snapshot([(h, None) for h in HASHES])  # what p0 holds now
    await publisher.publish(CacheChanges([], [HASHES[2]]))
    for _ in range(3):
        await reader.poll()
    assert reader.lost == 1
    assert _matched(index)["p0"] == 8 and index.num_blocks(["p0"]) == 2  # no 111 or 222
    late = PrefixIndex()  # a router that starts now begins at the same snapshot
    late_reader = KVEventReader(server.url, late, lambda: {"p0"}, block_s=0.05)
    try:
        await late_reader.poll()
        assert _matched(late)["p0"] == 8 and late.num_blocks(["p0"]) == 2
    finally:
        await late_reader.stop()
