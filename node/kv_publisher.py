"""A node's KV events: its prefix cache's changes, drained between engine steps and published
on the node's Redis stream (cluster.kv_events) for the routers' prefix index."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from cluster.kv_events import CacheChanges, KVEventPublisher
from engine.engine import LLMEngine
from engine.kv.tiered_blocks import TieredBlockManager
from engine.loop.engine_loop import EngineLoop
from node.settings import NodeSettings

log = logging.getLogger("splitserve.node")

STOP_S = 5.0


def _drain(engine: LLMEngine) -> CacheChanges:
    events = engine.block_manager.events
    if events is None:  # not recording yet: only a snapshot can say what is cached
        return CacheChanges([], [], overflowed=True)
    changes = events.drain()
    return CacheChanges(changes.stored, changes.removed, changes.overflowed, changes.lower)


@asynccontextmanager
async def kv_events(settings: NodeSettings, loop: EngineLoop) -> AsyncIterator[None]:
    """Publish the node's KV events while the context is open (when settings.kv_events);
    the stream is deleted when the node stops."""
    if not settings.kv_events or not loop.engine.config.enable_prefix_caching:
        yield
        return
    publisher = KVEventPublisher(
        settings.redis_url, settings.resolved_node_id(), uuid.uuid4().hex[:12],
        loop.engine.config.block_size, maxlen=settings.kv_events_maxlen,
    )  # fmt: skip
    blocks = loop.engine.block_manager
    capacity = blocks.num_total_blocks * 2
    if isinstance(blocks, TieredBlockManager):  # a block per hash in any tier
        capacity += 2 * sum(tier.capacity for tier in blocks.tiers.tiers)

    def cached(engine: LLMEngine) -> CacheChanges:
        blocks = engine.block_manager
        blocks.record_events(capacity).drain()  # the snapshot covers what the log held
        lower = blocks.lower_blocks() if isinstance(blocks, TieredBlockManager) else []
        return CacheChanges(blocks.cached_blocks(), [], lower=lower)

    async def snapshot() -> CacheChanges:
        return await loop.call(cached)

    async def drain() -> CacheChanges:
        return await loop.call(_drain)

    stop = asyncio.Event()
    task = asyncio.create_task(
        publisher.run(drain, snapshot, settings.kv_events_interval_s, stop), name="kv-events"
    )
    try:
        yield
    finally:
        stop.set()
        done, _ = await asyncio.wait({task}, timeout=STOP_S)
        if not done:
            task.cancel()
            log.warning("kv_events_stop_timeout node=%s", publisher.node_id)
        elif (error := task.exception()) is not None:  # the engine loop stopped first
            log.info("kv_events_stopped node=%s reason=%s", publisher.node_id, error)
        await publisher.close(delete=True)
