"""Cluster membership in Redis.

Each node owns one key, `<namespace>:node:<node_id>`, holding a `NodeRecord` as JSON with a
TTL. Every heartbeat rewrites the whole record (info + load) with a fresh TTL, so a node that
stops beating disappears after `ttl_s`, and a Redis that restarted empty learns every live
node again within one heartbeat.

The router reads membership through `Membership`, which polls Redis and keeps the last known
nodes when Redis is unreachable, and a node whose key expired while it still serves (it lost
Redis, the router did not: its /ready says so). `StaticMembership` serves a fixed list
(tests, setups without Redis). Both let the router mark a node unhealthy after a connection
error; the mark holds until the node's next heartbeat proves it alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

import httpx
import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from cluster.node_records import NodeInfo, NodeLoad, NodeRecord
from cluster.protocol import PROTOCOL_VERSION, READY, compatible

log = logging.getLogger("splitserve.registry")

DEFAULT_NAMESPACE = "splitserve"
REDIS_ERRORS: tuple[type[BaseException], ...] = (aioredis.RedisError, OSError, TimeoutError)
PROBE_TIMEOUT_S = 1.0  # a node's /ready, asked when its key is gone


def node_key(node_id: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    return f"{namespace}:node:{node_id}"


def connect(redis_url: str, timeout_s: float = 1.0) -> aioredis.Redis:
    """A client that fails fast (no internal retries): the loops here retry on their own."""
    return aioredis.Redis.from_url(
        redis_url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


class NodeRegistry:
    """A node's side: register, heartbeat, deregister. Each call raises on Redis errors;
    `run_heartbeats` is the loop that tolerates them."""

    def __init__(
        self,
        redis_url: str,
        ttl_s: float = 5.0,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        self._redis = connect(redis_url)
        self.ttl_s = ttl_s
        self.namespace = namespace
        self._info: NodeInfo | None = None
        self._load = NodeLoad()

    @property
    def info(self) -> NodeInfo | None:
        return self._info

    async def register(self, info: NodeInfo, load: NodeLoad | None = None) -> None:
        """Publish this node. Raises a redis error when Redis is unreachable."""
        self._info = info
        await self.heartbeat(load or self._load)

    async def heartbeat(self, load: NodeLoad) -> None:
        """Rewrite the full record with a fresh TTL."""
        if self._info is None:
            raise RuntimeError("heartbeat() before register()")
        self._load = load
        record = NodeRecord(info=self._info, load=load, heartbeat_at=time.time())
        key = node_key(self._info.node_id, self.namespace)
        await self._redis.set(key, record.model_dump_json(), px=int(self.ttl_s * 1000))

    async def deregister(self) -> None:
        """Remove this node's key (best effort: errors are logged, not raised)."""
        if self._info is None:
            return
        try:
            await self._redis.delete(node_key(self._info.node_id, self.namespace))
        except REDIS_ERRORS as exc:
            log.warning("deregister_failed node=%s error=%s", self._info.node_id, exc)

    async def run_heartbeats(
        self, load_fn: Callable[[], NodeLoad], interval_s: float, stop: asyncio.Event
    ) -> None:
        """Heartbeat every `interval_s` until `stop` is set. Redis outages are logged once and
        survived; the first beat after one re-registers the node in full.

        Stop it with the event, not by cancelling: on Python 3.11 a cancel that lands inside
        redis' own timeout can be swallowed, and awaiting the task would then hang.
        """
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        down = False
        while not stop.is_set():
            try:
                await self.heartbeat(load_fn())
                if down:
                    log.info("redis_reachable node=%s re_registered=true", self._node_id())
                down = False
            except REDIS_ERRORS as exc:
                if not down:
                    log.warning("redis_unreachable node=%s error=%s", self._node_id(), exc)
                down = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    def _node_id(self) -> str:
        return self._info.node_id if self._info else "?"

    async def close(self) -> None:
        await self._redis.aclose()


class StaticMembership:
    """A node list set by the caller (`update`), with the router's unhealthy marks.

    A node marked unhealthy is hidden from `nodes()` until an update brings a record with a
    different `heartbeat_at` (a newer heartbeat) for it. So is a node whose protocol version
    is more than one from this process's (`incompatible()` lists them; logged once each).
    """

    def __init__(self, records: Iterable[NodeRecord] = ()) -> None:
        self._records: dict[str, NodeRecord] = {}
        self._marked: dict[str, float] = {}  # node_id -> heartbeat_at seen when marked
        self._incompatible: dict[str, int] = {}  # node_id -> its protocol version
        self.update(records)

    async def start(self) -> None:
        """Nothing to start; `Membership` overrides this."""

    async def stop(self) -> None:
        """Nothing to stop; `Membership` overrides this."""

    def update(self, records: Iterable[NodeRecord]) -> None:
        """Replace the membership. Absent nodes are dropped; a newer heartbeat clears a mark."""
        self._records = {r.info.node_id: r for r in records}
        self._note_incompatible()
        for node_id, seen in list(self._marked.items()):
            record = self._records.get(node_id)
            if record is None or record.heartbeat_at != seen:
                del self._marked[node_id]
                if record is not None:
                    log.info("node_healthy_again node=%s", node_id)

    def _note_incompatible(self) -> None:
        now = {
            node_id: r.info.protocol_version
            for node_id, r in self._records.items()
            if not compatible(r.info.protocol_version, PROTOCOL_VERSION)
        }
        for node_id, version in now.items():
            if self._incompatible.get(node_id) != version:
                log.warning(
                    "node_incompatible node=%s protocol_version=%d ours=%d routed=false",
                    node_id, version, PROTOCOL_VERSION,
                )  # fmt: skip
        self._incompatible = now

    def nodes(self) -> list[NodeRecord]:
        """Known nodes not marked unhealthy, of a compatible protocol, by node id."""
        return [
            r
            for node_id, r in sorted(self._records.items())
            if self._marked.get(node_id) != r.heartbeat_at and node_id not in self._incompatible
        ]

    def incompatible(self) -> list[str]:
        """Node ids left out of `nodes()` for their protocol version."""
        return sorted(self._incompatible)

    def all_nodes(self) -> list[NodeRecord]:
        return [r for _, r in sorted(self._records.items())]

    def mark_unhealthy(self, node_id: str) -> None:
        """Hide a node until its next heartbeat (called after a connection error)."""
        record = self._records.get(node_id)
        if record is not None and node_id not in self._marked:
            self._marked[node_id] = record.heartbeat_at
            log.warning("node_marked_unhealthy node=%s", node_id)


class Membership(StaticMembership):
    """Polls Redis every `poll_s`; keeps the last known nodes while Redis is unreachable.

    A Redis that restarted (another `run_id`) comes back empty: for `resync_s` after that,
    nodes that have not registered again yet are kept, so the router does not answer 503
    while the nodes' next heartbeats refill it.

    A node whose key expired is asked for its /ready: one that still serves but cannot reach
    Redis (`serving`: loaded, engine alive, not draining) is kept until it registers again
    or stops serving, so that a Redis cut off from the nodes alone does not empty the pools.
    A draining, dead or unreachable node goes at once.
    """

    def __init__(
        self,
        redis_url: str,
        poll_s: float = 1.0,
        namespace: str = DEFAULT_NAMESPACE,
        resync_s: float = 5.0,
    ) -> None:
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s!r}")
        super().__init__()
        self._redis_url = redis_url
        self._redis: aioredis.Redis | None = None
        self.poll_s = poll_s
        self.namespace = namespace
        self.redis_ok = False
        self.resync_s = resync_s
        self._run_id: str | None = None
        self._resync_until = 0.0
        self._outage_logged = False
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._http: httpx.AsyncClient | None = None
        self._kept: set[str] = set()  # nodes kept without a key, for the log

    @property
    def redis(self) -> aioredis.Redis | None:
        """The client it polls with (None before start): other cluster keys go through it."""
        return self._redis

    async def start(self) -> None:
        """One immediate poll (a failure is tolerated), then poll in the background."""
        self._redis = connect(self._redis_url)
        self._http = httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, trust_env=False)
        await self.refresh()
        self._task = asyncio.create_task(self._poll_loop(), name="membership-poll")

    async def stop(self) -> None:
        if self._task is not None:
            self._stop.set()  # not a cancel: see NodeRegistry.run_heartbeats
            done, _ = await asyncio.wait({self._task}, timeout=self.poll_s + 5.0)
            if not done:
                self._task.cancel()
            self._task = None
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def refresh(self) -> bool:
        """Poll once. Returns whether Redis answered; on failure the membership is kept."""
        if self._redis is None:
            raise RuntimeError("Membership.refresh() before start()")
        try:
            run_id = await self._run_id_of(self._redis)
            records = await self._read_all(self._redis)
        except REDIS_ERRORS as exc:
            if not self._outage_logged:
                log.warning("redis_unreachable keeping_nodes=%d error=%s", len(self._records), exc)
                self._outage_logged = True
            self.redis_ok = False
            return False
        if self._outage_logged:
            log.info("redis_reachable nodes=%d", len(records))
            self._outage_logged = False
        self.redis_ok = True
        self.update(await self._with_serving(self._resync(run_id, records)))
        return True

    async def _run_id_of(self, client: aioredis.Redis) -> str:
        info = await client.info("server")
        return str(info.get("run_id", ""))

    def _resync(self, run_id: str, records: list[NodeRecord]) -> list[NodeRecord]:
        """`records`, plus the last known nodes while a restarted Redis refills."""
        now = time.monotonic()
        if self._run_id is not None and run_id != self._run_id:
            self._resync_until = now + self.resync_s
            log.warning(
                "redis_restarted keeping_nodes=%d for_s=%.1f", len(self._records), self.resync_s
            )
        self._run_id = run_id
        if now >= self._resync_until:
            return records
        merged = dict(self._records)
        merged.update({r.info.node_id: r for r in records})
        return list(merged.values())

    async def _with_serving(self, records: list[NodeRecord]) -> list[NodeRecord]:
        """`records`, plus the healthy known nodes missing from them that still serve."""
        listed = {r.info.node_id for r in records}
        missing = [r for r in self.nodes() if r.info.node_id not in listed]
        serving = await asyncio.gather(*(self._serves_unlisted(r) for r in missing))
        kept = [r for r, yes in zip(missing, serving, strict=True) if yes]
        for node_id in {r.info.node_id for r in kept} - self._kept:
            log.warning("node_unregistered_but_serving node=%s kept=true", node_id)
        self._kept = {r.info.node_id for r in kept}
        return records + kept

    async def _serves_unlisted(self, record: NodeRecord) -> bool:
        """Whether the node's /ready says it serves (loaded, engine alive, not draining)."""
        if self._http is None:
            return False
        try:
            body = (await self._http.get(record.info.url + READY)).json()
        except (httpx.HTTPError, ValueError):
            return False
        return isinstance(body, dict) and body.get("serving") is True

    async def _read_all(self, client: aioredis.Redis) -> list[NodeRecord]:
        keys = [k async for k in client.scan_iter(match=f"{self.namespace}:node:*", count=500)]
        values = await client.mget(keys) if keys else []
        records = []
        for key, raw in zip(keys, values, strict=True):
            if raw is None:  # expired between SCAN and MGET
                continue
            try:
                records.append(NodeRecord.model_validate_json(raw))
            except ValidationError:
                log.warning("bad_node_record key=%s", key)
        return records

    async def _poll_loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.poll_s)
            if not self._stop.is_set():
                await self.refresh()
