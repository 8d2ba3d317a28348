"""The block manager's invariants, checked against the block tables of all live requests
(engine.kv.block_manager): meant for tests and debugging."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol


class AuditedBlock(Protocol):
    block_id: int
    ref_count: int
    hash: int | None


def audit_blocks(
    blocks: Sequence[AuditedBlock],
    free_list: Collection[int],
    evictable: Collection[int],
    cached: Mapping[int, int],
    block_tables: Iterable[Sequence[int]],
) -> None:
    """Raise RuntimeError naming the first violation: each block owned by as many tables as
    its ref count, or else exactly one of free (unregistered) or evictable (registered), and
    every cache entry pointing at the block that carries its hash."""
    owners: Counter[int] = Counter()
    for table in block_tables:
        if len(set(table)) != len(table):
            raise RuntimeError(f"a block table lists a block twice: {list(table)}")
        owners.update(table)
    free = set(free_list)
    if len(free) != len(free_list):
        raise RuntimeError("the free list holds a block twice")
    for block in blocks:
        _audit_block(block, owners[block.block_id], block.block_id in free, evictable)
    for digest, block_id in cached.items():
        if blocks[block_id].hash != digest:
            raise RuntimeError(f"cache entry {digest:#x} points at block {block_id} wrongly")


def _audit_block(
    block: AuditedBlock, owners: int, in_free: bool, evictable: Collection[int]
) -> None:
    in_evictable = block.block_id in evictable
    where = f"block {block.block_id}"
    if block.ref_count != owners:
        raise RuntimeError(f"{where}: ref count {block.ref_count}, {owners} owners")
    if owners and (in_free or in_evictable):
        raise RuntimeError(f"{where}: owned yet listed as free or evictable")
    if not owners and in_free == in_evictable:
        raise RuntimeError(f"{where}: unowned, must be exactly one of free or evictable")
    if in_free and block.hash is not None:
        raise RuntimeError(f"{where}: free yet still registered in the cache")
    if in_evictable and block.hash is None:
        raise RuntimeError(f"{where}: evictable yet not registered in the cache")
