"""The bookkeeping of the KV tiers below the device: host memory, then local disk.

Integers only, like the block manager that drives it: it decides which block goes where and
writes copy orders; the engine's copier (engine.kv.copier) carries them out in order, off
the step's critical path, and the next forward waits only for the orders marked blocking.

- Write-behind: a device block that leaves its last request while cached is copied to the
  host tier and from there to the disk tier (unless it is there already). Disk is written
  through, so it survives a restart and a host eviction costs no copy. The file writes run
  on a lane of their own (engine.kv.copier), so no load waits behind them; the host slot a
  write reads is pinned until the copier says it is written (`writes_done`). A write is
  dropped (and counted) only when the disk is so far behind that every host slot is pinned
  or reserved, and a block only when the memory copies are `max_backlog` behind
  (`copy_backlog`).
- Loads: a prefix block found in a lower tier is copied into a freshly allocated device
  block before the request's first step (blocking).
- Swap: a preempted request's blocks are copied into reserved host slots and back
  (blocking both ways: the device blocks are reused or read by the next forward).

Orders run first in, first out (file orders after the memory copies before them): a slot
is never overwritten before an earlier order that reads it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from engine.kv.tier_index import TierCounters, TierEntry, TierIndex

HOST, DISK = "host", "disk"
# queued memory copies past which write-behind copies are dropped: a step's loads wait
# behind at most this many, or COPY_BACKLOG_S of them where that is more (file writes run
# on their own lane and hold no load up)
MAX_BACKLOG = 256
COPY_BACKLOG_S = 0.05


def copy_backlog(copy_bytes_per_s: float, block_bytes: int) -> int:
    """The memory copies a step's loads may wait behind: the copier's COPY_BACKLOG_S at its
    measured rate, at least MAX_BACKLOG."""
    return max(MAX_BACKLOG, int(COPY_BACKLOG_S * copy_bytes_per_s / block_bytes))


class CopyKind(Enum):
    DEVICE_TO_HOST = "device_to_host"  # block_id -> host slot
    HOST_TO_DEVICE = "host_to_device"  # host slot -> block_id
    HOST_TO_DISK = "host_to_disk"  # host slot -> the file of entry
    DISK_TO_DEVICE = "disk_to_device"  # the file of entry -> block_id
    DELETE_FILE = "delete_file"  # the file of entry

    @property
    def on_file(self) -> bool:
        """Run on the copier's file lane (a write or a delete), behind the memory copies."""
        return self in (CopyKind.HOST_TO_DISK, CopyKind.DELETE_FILE)


@dataclass(frozen=True)
class CopyOrder:
    kind: CopyKind
    block_id: int = 0
    slot: int = 0
    entry: TierEntry | None = None  # disk orders: the file's block
    blocking: bool = False  # the next forward waits for it


@dataclass(frozen=True)
class TierHit:
    """A prefix block found below the device."""

    tier: str
    entry: TierEntry


class TierBook:
    """Indexes of the host and disk tiers (None: that tier is off) and the orders to run."""

    def __init__(
        self,
        host_blocks: int,
        disk_blocks: int = 0,
        disk_entries: list[TierEntry] | None = None,
        max_backlog: int = MAX_BACKLOG,
    ) -> None:
        if host_blocks < 1:
            raise ValueError(f"the host tier must hold at least one block, got {host_blocks}")
        self.host = TierIndex(HOST, host_blocks)
        self.disk = TierIndex(DISK, disk_blocks) if disk_blocks > 0 else None
        self.max_backlog = max_backlog
        self.backlog = 0  # memory copies queued and not done, as the copier last said
        self.orders: list[CopyOrder] = []
        self._copies = 0  # memory copies among `orders`
        self._writing: deque[int] = deque()  # host slots of the file writes not done, in order
        self._writes_done = 0  # file writes done, as the copier last said
        self.evicted: list[int] = []  # device blocks reclaimed since the last drain
        # called with (hash, parent hash) when a block left a lower tier (events)
        self.on_moved: Callable[[int, int | None], None] | None = None
        for entry in disk_entries or ():
            self.adopt_disk(entry)

    @property
    def tiers(self) -> list[TierIndex]:
        return [self.host] if self.disk is None else [self.host, self.disk]

    def counters(self) -> dict[str, TierCounters]:
        return {t.name: t.counters for t in self.tiers}

    def where(self, block_hash: int) -> str | None:
        """The fastest lower tier holding the block."""
        for tier in self.tiers:
            if block_hash in tier:
                return tier.name
        return None

    def adopt_disk(self, entry: TierEntry) -> bool:
        """A block file found at start (engine.kv.disk_store): indexed, unless the tier is
        full (then it is deleted like an eviction)."""
        if self.disk is None:
            return False
        new, evicted = self.disk.insert(entry.block_hash, entry.parent_hash, entry.token_ids)
        self.disk.counters.stores -= 1  # found, not written
        self._forget_files(evicted)
        return new is not None

    # ---- the block manager's side -----------------------------------------------------------

    def find(
        self, block_hash: int, token_ids: tuple[int, ...], parent_hash: int | None
    ) -> TierHit | None:
        for tier in self.tiers:
            entry = tier.find(block_hash, token_ids, parent_hash)
            if entry is not None:
                return TierHit(tier.name, entry)
        return None

    @property
    def writes_pending(self) -> int:
        """File writes ordered and not done, as the copier last said."""
        return len(self._writing)

    def save(
        self, block_id: int, block_hash: int, parent_hash: int | None, tokens: tuple[int, ...]
    ) -> None:
        """Write-behind: a cached device block lost its last owner."""
        if block_hash in self.host:
            return
        disk = self.disk if self.disk is not None and block_hash not in self.disk else None
        entry = None
        if self.backlog + self._copies < self.max_backlog:
            entry, evicted = self.host.insert(block_hash, parent_hash, tokens)
            self._spill(evicted)
        if entry is None:  # the copies are far behind, or every host slot is held
            self.host.counters.dropped += 1
            if disk is not None:
                disk.counters.dropped += 1
            return
        self._order(CopyOrder(CopyKind.DEVICE_TO_HOST, block_id, entry.slot))
        if disk is not None:
            self._write_through(disk, entry)

    def writes_done(self, total: int) -> None:
        """The copier has finished `total` file writes since the start (in order): their host
        slots may be evicted again."""
        while self._writes_done < total and self._writing:
            self.host.unpin(self._writing.popleft())
            self._writes_done += 1

    def load(self, hit: TierHit, block_id: int) -> None:
        """Copy a lower-tier hit into a fresh device block before the next forward."""
        tier = self.host if hit.tier == HOST else self.disk
        assert tier is not None
        tier.counters.hits += 1
        tier.counters.loads += 1
        if hit.tier == HOST:
            order = CopyOrder(CopyKind.HOST_TO_DEVICE, block_id, hit.entry.slot, blocking=True)
        else:
            order = CopyOrder(CopyKind.DISK_TO_DEVICE, block_id, entry=hit.entry, blocking=True)
        self._order(order)

    def device_evicted(self, block_id: int) -> None:
        """A cached device block is being reused: its pending write-behind must finish first."""
        self.evicted.append(block_id)

    def swap_out(self, block_ids: list[int]) -> list[int] | None:
        """Reserve host slots for a preempted request's blocks and order their copies; None
        (nothing changed) when the host tier cannot take them all."""
        if self.host.num_available < len(block_ids):
            return None
        slots: list[int] = []
        for block_id in block_ids:
            slot, evicted = self.host.reserve()
            assert slot is not None
            self._spill(evicted)
            slots.append(slot)
            self._order(CopyOrder(CopyKind.DEVICE_TO_HOST, block_id, slot, blocking=True))
        return slots

    def swap_in(self, slots: list[int], block_ids: list[int]) -> None:
        """Copy swapped blocks back into device blocks, and give their slots back."""
        for slot, block_id in zip(slots, block_ids, strict=False):
            self._order(CopyOrder(CopyKind.HOST_TO_DEVICE, block_id, slot, blocking=True))
        self.release(slots)

    def release(self, slots: list[int]) -> None:
        """Give reserved slots back (a swapped request swapped in or gone). Their last copy
        order stays ahead of any later use of the slot (first in, first out)."""
        for slot in slots:
            self.host.unreserve(slot)

    def take_orders(self) -> tuple[list[CopyOrder], list[int]]:
        """The orders and the evicted device blocks since the last call."""
        orders, evicted = self.orders, self.evicted
        self.orders, self.evicted, self._copies = [], [], 0
        return orders, evicted

    def audit(self) -> None:
        for tier in self.tiers:
            tier.audit()
        if self.host.num_pinned != len(self._writing):
            raise RuntimeError("the host tier's pins do not match the pending file writes")

    # ---- internals --------------------------------------------------------------------------

    def _write_through(self, disk: TierIndex, entry: TierEntry) -> None:
        """Order the file write of a block just copied to the host slot of `entry`; the
        slot stays pinned until the write is done."""
        on_disk, dropped = disk.insert(entry.block_hash, entry.parent_hash, entry.token_ids)
        self._forget_files(dropped)
        if on_disk is not None:
            self.host.pin(entry.slot)
            self._writing.append(entry.slot)
            self.orders.append(CopyOrder(CopyKind.HOST_TO_DISK, slot=entry.slot, entry=on_disk))

    def _order(self, order: CopyOrder) -> None:
        """A memory copy (file orders go straight to `orders`)."""
        self.orders.append(order)
        self._copies += 1

    def _spill(self, evicted: list[TierEntry]) -> None:
        """Host entries evicted for room (the disk may hold them still: written through)."""
        for gone in evicted:
            self._moved(gone)

    def _forget_files(self, evicted: list[TierEntry]) -> None:
        for gone in evicted:
            self.orders.append(CopyOrder(CopyKind.DELETE_FILE, entry=gone))
            self._moved(gone)

    def _moved(self, entry: TierEntry) -> None:
        if self.on_moved is not None:
            self.on_moved(entry.block_hash, entry.parent_hash)
