"""KV events: which blocks each node's prefix cache holds, published on Redis Streams.

Every node with a prefix cache appends `KVEventMsg`s to its own capped stream,
`<namespace>:kv:<node_id>`: deltas (blocks stored, blocks evicted) and now and then a
snapshot (the whole cache). `<namespace>:kvsnap:<node_id>` holds the stream id of the latest
snapshot, so a reader that starts late, or finds a gap, begins there. A node publishes a
snapshot when it starts, after a Redis outage, when Redis restarted empty (the pointer is
gone), when its event log overflowed, and every `maxlen // 2` deltas, so the latest snapshot
is always still in the capped stream. `seq` counts a node incarnation's messages: a reader
that sees a jump knows it lost some. A lost message costs routing quality, never a wrong
answer: nodes verify every prefix hit against the token ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from cluster.registry import DEFAULT_NAMESPACE, REDIS_ERRORS, connect

log = logging.getLogger("splitserve.kv_events")

FIELD = b"m"  # the stream entry's one field: the message as JSON


def stream_key(node_id: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    return f"{namespace}:kv:{node_id}"


def snapshot_key(node_id: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    return f"{namespace}:kvsnap:{node_id}"


class KVEventMsg(BaseModel):
    """One stream entry. `snapshot`: `stored` and `lower` are the whole cache, replacing what
    a reader knew of this node. `stored` holds (block hash, parent hash or None) of blocks on
    the device; `lower` (block hash, parent hash or None, tier) of blocks held only in a tier
    below it ("host", "disk": a hit costs a load, not a prefill); `removed` the hashes gone
    from every tier. `sent_at`: the node's unix time, for the readers' lag metric."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str
    incarnation: str
    seq: int = Field(ge=0)
    snapshot: bool = False
    block_size: int = Field(ge=1)
    stored: list[tuple[int, int | None]] = Field(default_factory=list)
    removed: list[int] = Field(default_factory=list)
    lower: list[tuple[int, int | None, str]] = Field(default_factory=list)
    sent_at: float = 0.0


@dataclass(frozen=True)
class CacheChanges:
    """What a node's cache did since the last look (mirrors engine.kv.events.KVChanges)."""

    stored: list[tuple[int, int | None]]
    removed: list[int]
    overflowed: bool = False
    lower: list[tuple[int, int | None, str]] = field(default_factory=list)


# the whole cache: the device's blocks, or (with tiers below it) both lists of CacheChanges
Snapshot = Callable[[], Awaitable[list[tuple[int, int | None]] | CacheChanges]]
Drain = Callable[[], Awaitable[CacheChanges]]


class KVEventPublisher:
    """A node's side. `run` drains the cache's changes every `interval_s` and publishes them;
    Redis outages are survived (then a snapshot restores the readers' view)."""

    def __init__(
        self,
        redis_url: str,
        node_id: str,
        incarnation: str,
        block_size: int,
        *,
        maxlen: int = 10_000,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        if maxlen < 4:
            raise ValueError(f"maxlen must be >= 4, got {maxlen}")
        self._redis = connect(redis_url)
        self.node_id, self.incarnation, self.block_size = node_id, incarnation, block_size
        self.maxlen = maxlen
        self._stream = stream_key(node_id, namespace)
        self._pointer = snapshot_key(node_id, namespace)
        self._seq = 0
        self._since_snapshot = 0
        self.need_snapshot = True

    async def publish_snapshot(
        self,
        blocks: list[tuple[int, int | None]],
        lower: list[tuple[int, int | None, str]] | None = None,
    ) -> None:
        """Append a snapshot and point the snapshot key at it. Raises on Redis errors."""
        entry = await self._append(self._msg(blocks, [], snapshot=True, lower=lower))
        await self._redis.set(self._pointer, entry)
        self.need_snapshot, self._since_snapshot = False, 0

    async def publish(self, changes: CacheChanges) -> None:
        """Append a delta (nothing when empty). Sets `need_snapshot` when one is due: the
        log overflowed, the snapshot pointer vanished (Redis restarted), or the stream is
        half way to its cap since the last one. Raises on Redis errors."""
        if changes.overflowed:
            self.need_snapshot = True
            return
        if changes.stored or changes.removed or changes.lower:
            msg = self._msg(changes.stored, changes.removed, snapshot=False, lower=changes.lower)
            await self._append(msg)
            self._since_snapshot += 1
        if not await self._redis.exists(self._pointer) or self._since_snapshot >= self.maxlen // 2:
            self.need_snapshot = True

    async def run(
        self, drain: Drain, snapshot: Snapshot, interval_s: float, stop: asyncio.Event
    ) -> None:
        """Publish until `stop` is set (an event, not a cancel: see NodeRegistry)."""
        down = False
        while not stop.is_set():
            try:
                if self.need_snapshot:
                    whole = await snapshot()
                    if isinstance(whole, CacheChanges):
                        await self.publish_snapshot(whole.stored, whole.lower)
                    else:
                        await self.publish_snapshot(whole)
                else:
                    await self.publish(await drain())
                if down:
                    log.info("kv_events_resumed node=%s", self.node_id)
                down = False
            except REDIS_ERRORS as exc:
                if not down:
                    log.warning("kv_events_unpublished node=%s error=%s", self.node_id, exc)
                down, self.need_snapshot = True, True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    async def close(self, delete: bool = False) -> None:
        """Close the connection; `delete` removes the stream (the node leaves for good)."""
        if delete:
            with contextlib.suppress(*REDIS_ERRORS):
                await self._redis.delete(self._stream, self._pointer)
        await self._redis.aclose()

    def _msg(
        self,
        stored: list[tuple[int, int | None]],
        removed: list[int],
        *,
        snapshot: bool,
        lower: list[tuple[int, int | None, str]] | None = None,
    ) -> KVEventMsg:
        self._seq += 1
        return KVEventMsg(
            node_id=self.node_id, incarnation=self.incarnation, seq=self._seq,
            snapshot=snapshot, block_size=self.block_size, stored=stored, removed=removed,
            lower=lower or [], sent_at=time.time(),
        )  # fmt: skip

    async def _append(self, msg: KVEventMsg) -> bytes:
        entry = await self._redis.xadd(
            self._stream, {FIELD: msg.model_dump_json()}, maxlen=self.maxlen, approximate=True
        )
        return entry.encode() if isinstance(entry, str) else entry
