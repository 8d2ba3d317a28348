"""Imports from a prefill node whose KV cache dtype differs from this node's.

A prefill pool may keep fp32 KV while the decode pool keeps int8 (or the other way round):
the layouts then differ in ``kv_cache_dtype`` alone. Such a handle is read into a staging
cache of the prefill node's layout (registered with its own transfer agent, allocated at
the first such import and sized for one request of max_model_len), then converted block by
block into the request's blocks here (dequantised / quantised). One staged import at a time.
A handle whose layout differs in anything else is refused, naming both layouts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import torch

from decode_node.importer import DecodeJob, PullResult, pull
from engine.kv.cache import KVLayout, allocate_kv_cache, copy_converted
from engine.kv_format.dtypes import KV_CACHE_DTYPES
from engine.scheduler.plan import ImportPlan
from kv_transfer import KVTransferAgent

log = logging.getLogger("splitserve.decode")


class KVConverter:
    """Staged, converting imports into ``kv`` (this node's cache of ``layout``)."""

    def __init__(
        self, agent: KVTransferAgent, kv: torch.Tensor, layout: KVLayout, max_blocks: int
    ) -> None:
        self.agent, self.kv, self.layout, self.max_blocks = agent, kv, layout, max_blocks
        self._foreign = {
            other.fingerprint(): other
            for other in (layout.with_kv_dtype(d) for d in KV_CACHE_DTYPES)
            if other != layout
        }
        self._stages: dict[str, tuple[KVTransferAgent, torch.Tensor]] = {}
        self._lock = asyncio.Lock()

    def foreign_fingerprints(self) -> list[str]:
        """The layouts (this one in the other KV dtypes) whose blocks this node converts."""
        return sorted(self._foreign)

    def layout_of(self, fingerprint: str) -> KVLayout | None:
        """The layout of a handle this node converts (None: not one it can)."""
        return self._foreign.get(fingerprint)

    async def pull(self, job: DecodeJob, plan: ImportPlan, src: KVLayout) -> PullResult:
        """Read the handle's blocks into the staging cache, then convert them into the plan's
        blocks. Never raises for a failed transfer (like ``importer.pull``)."""
        fill = plan.fill_block_ids
        staged_ids = tuple(range(plan.num_cached_blocks + len(fill)))
        if len(staged_ids) > self.max_blocks:
            return PullResult(f"{len(staged_ids)} blocks exceed the staging cache", kind="other")
        async with self._lock:
            stage_agent, stage = self._stage(src)
            result = await pull(stage_agent, job, dataclasses.replace(plan, block_ids=staged_ids))
            if result.error is None and not result.aborted:
                copy_converted(
                    stage, src, self.kv, self.layout, staged_ids[plan.num_cached_blocks :], fill
                )
        return result

    def _stage(self, src: KVLayout) -> tuple[KVTransferAgent, torch.Tensor]:
        if src.kv_dtype not in self._stages:
            stage = allocate_kv_cache(src, self.max_blocks, self.kv.device)
            config = dataclasses.replace(
                self.agent.config, node_name=f"{self.agent.config.node_name}-{src.kv_dtype}"
            )
            stage_agent = KVTransferAgent(
                stage, fingerprint=src.fingerprint(), layout=src.describe(), config=config
            )
            log.info(
                "kv_convert staging kv_dtype=%s blocks=%d bytes=%d",
                src.kv_dtype,
                self.max_blocks,
                self.max_blocks * src.block_bytes,
            )
            self._stages[src.kv_dtype] = (stage_agent, stage)
        return self._stages[src.kv_dtype]
