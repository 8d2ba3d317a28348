"""KV tiers below the device, assembled for an engine: the host tier (`kv_offload_cpu_gb`),
the disk tier (`kv_offload_disk_path`, `kv_offload_disk_gb`), their bookkeeping
(engine.kv.tier_book, engine.kv.tiered_blocks) and their copier (engine.kv.copier).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.kv.block_manager import BlockManager
from engine.kv.cache import KVLayout
from engine.kv.copier import FLUSH_S, KVLoadError, TierCopier
from engine.kv.disk_store import DiskStore
from engine.kv.sizing import GIB
from engine.kv.tier_book import CopyKind, CopyOrder, TierBook, copy_backlog
from engine.kv.tiered_blocks import TieredBlockManager

log = logging.getLogger("splitserve.engine.kv.offload")


@dataclass
class KVTiers:
    """An engine's lower tiers: indexes (integers) and copier (tensors)."""

    book: TierBook
    copier: TierCopier
    disk_files_dropped: Counter[str]  # bad files found at start, or at a load, by reason
    blocks: TieredBlockManager

    def submit(self) -> None:
        """Hand the orders written since the last call to the copier (after scheduling, and
        when the engine is idle), and tell the book how far the copier got."""
        orders, evicted = self.book.take_orders()
        self.copier.submit(orders, evicted)
        self.book.backlog = self.copier.backlog
        self.book.writes_done(self.copier.writes_done)

    @property
    def busy(self) -> bool:
        """Copies queued or under way (an idle engine keeps its counters fresh meanwhile)."""
        return bool(self.copier.backlog or self.copier.disk_backlog or self.book.writes_pending)

    def close(self, timeout_s: float = FLUSH_S) -> None:
        """Write the queued blocks to disk within `timeout_s`, stop the copier, and log what
        was flushed; writes left undone are counted as dropped."""
        self.submit()
        flushed = self.copier.close(timeout_s)
        if self.book.disk is not None:
            self.book.disk.counters.dropped += flushed.left
            log.info(
                "kv_tier_flush blocks_flushed=%d dropped=%d seconds=%.2f",
                flushed.written, flushed.left, flushed.seconds,
            )  # fmt: skip

    def wait(self) -> None:
        """Before a forward: until its copies are done. A failed load (a file gone bad since
        the start) drops the file from the disk tier and the block from the device cache,
        then raises: the step fails, nothing wrong is served."""
        try:
            self.copier.wait()
        except KVLoadError as exc:
            entry = exc.order.entry
            if entry is not None and self.book.disk is not None:
                self.book.disk.remove(entry.block_hash)
                self.book.orders.append(CopyOrder(CopyKind.DELETE_FILE, entry=entry))
                self.disk_files_dropped["bad at load"] += 1
            self.blocks.forget(exc.order.block_id)
            raise

    def stats(self) -> dict[str, float]:
        """Flat numbers per tier: capacity, used, hits, loads, stores, evictions, dropped
        (blocks) and bytes in and out."""
        out: dict[str, float] = {}
        for tier in self.book.tiers:
            c, name = tier.counters, tier.name
            out[f"{name}_capacity_blocks"] = tier.capacity
            out[f"{name}_used_blocks"] = len(tier) + tier.num_reserved
            out[f"{name}_reserved_blocks"] = tier.num_reserved
            for key in ("hits", "loads", "stores", "evictions", "dropped"):
                out[f"{name}_{key}"] = getattr(c, key)
            out[f"{name}_bytes_in"] = self.copier.bytes[f"{name}_in"]
            out[f"{name}_bytes_out"] = self.copier.bytes[f"{name}_out"]
        out["copy_errors"] = self.copier.errors
        out["copy_backlog"] = self.copier.backlog
        out["disk_write_backlog"] = self.copier.disk_backlog
        for reason, n in self.disk_files_dropped.items():
            out[f"disk_files_dropped_{reason}"] = n
        return out


def build_tiers(
    config: EngineConfig, layout: KVLayout, kv_cache: torch.Tensor, num_blocks: int
) -> tuple[BlockManager, KVTiers | None]:
    """The engine's block manager, tiered when `kv_offload_cpu_gb` is set."""
    if config.kv_offload_cpu_gb is None:
        return BlockManager(num_blocks, config.block_size, config.enable_prefix_caching), None
    host_blocks = int(config.kv_offload_cpu_gb * GIB) // layout.block_bytes
    if host_blocks < 1:
        raise ValueError(
            f"kv_offload_cpu_gb {config.kv_offload_cpu_gb} holds no KV block of "
            f"{layout.block_bytes} bytes"
        )
    disk, entries, dropped, disk_blocks = None, [], Counter[str](), 0
    if config.kv_offload_disk_path is not None:
        assert config.kv_offload_disk_gb is not None  # EngineConfig checks it
        disk = DiskStore(config.kv_offload_disk_path, layout)
        disk_blocks = int(config.kv_offload_disk_gb * GIB) // disk.file_bytes(config.block_size)
        if disk_blocks < 1:
            raise ValueError(
                f"kv_offload_disk_gb {config.kv_offload_disk_gb} holds no KV block file of "
                f"{disk.file_bytes(config.block_size)} bytes"
            )
        found = disk.scan()
        entries, dropped = found.entries, found.dropped
    copier = TierCopier(kv_cache, layout, host_blocks, disk)
    backlog = copy_backlog(copier.copy_bytes_per_s, layout.block_bytes)
    book = TierBook(host_blocks, disk_blocks, entries, max_backlog=backlog)
    manager = TieredBlockManager(num_blocks, config.block_size, config.enable_prefix_caching, book)
    copier.submit(*book.take_orders())  # files past the disk tier's size: deleted
    log.info(
        "kv_tiers host_blocks=%d disk_blocks=%d disk_files=%d disk_blocks_indexed=%d "
        "disk_files_dropped=%d copy_gbps=%.2f copy_backlog=%d",
        host_blocks, disk_blocks, len(entries), len(book.disk) if book.disk else 0,
        sum(dropped.values()), copier.copy_bytes_per_s / 1e9, backlog,
    )  # fmt: skip
    return manager, KVTiers(book, copier, dropped, manager)
