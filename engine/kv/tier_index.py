"""The index of one KV tier below the device (host memory, local disk): which block hashes it
holds, in which slot, in LRU order. Integers only; the bytes live in the host tier's tensor
(engine.kv.copier) and in engine.kv.disk_store's files.

An entry holds the block's chained hash, its parent's hash and its own token ids: a lookup
checks both, so a hash collision is a miss, never a wrong answer. Slots are either cached
entries (evicted least recently used first) or reserved (a preempted request's swapped
blocks, never evicted, given back by `unreserve`). A cached entry may be pinned (the host
slot a pending file write reads): it is found as usual but not evicted until `unpin`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TierEntry:
    block_hash: int
    parent_hash: int | None
    token_ids: tuple[int, ...]
    slot: int


@dataclass
class TierCounters:
    """Monotonic totals of one tier, in blocks (bytes: blocks x block bytes)."""

    hits: int = 0  # blocks found here by a request's prefix lookup
    loads: int = 0  # blocks copied out of this tier into the device cache
    stores: int = 0  # blocks written into this tier
    evictions: int = 0  # cached blocks dropped for room
    dropped: int = 0  # writes skipped: the copy queue was full, or every slot was held


@dataclass
class TierIndex:
    """LRU index of a tier of `capacity` slots."""

    name: str
    capacity: int
    counters: TierCounters = field(default_factory=TierCounters)

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, int) or self.capacity < 0:
            raise ValueError(
                f"{self.name} tier capacity must be an integer >= 0, got {self.capacity!r}"
            )
        self._entries: OrderedDict[int, TierEntry] = OrderedDict()  # oldest first
        self._free: list[int] = list(range(self.capacity - 1, -1, -1))  # pop() gives slot 0 first
        self._reserved: set[int] = set()
        self._pinned: set[int] = set()  # cached slots that may not be evicted for now

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_reserved(self) -> int:
        return len(self._reserved)

    @property
    def num_pinned(self) -> int:
        return len(self._pinned)

    @property
    def num_available(self) -> int:
        """Slots a reservation or an insert may take: free ones plus unpinned cached ones."""
        return len(self._free) + len(self._entries) - len(self._pinned)

    def entries(self) -> list[TierEntry]:
        """Every cached entry, least recently used first."""
        return list(self._entries.values())

    def get(self, block_hash: int) -> TierEntry | None:
        return self._entries.get(block_hash)

    def find(
        self, block_hash: int, token_ids: tuple[int, ...], parent_hash: int | None
    ) -> TierEntry | None:
        """The entry holding exactly this block (same tokens, same parent), made most recent."""
        entry = self._entries.get(block_hash)
        if entry is None or entry.token_ids != token_ids or entry.parent_hash != parent_hash:
            return None
        self._entries.move_to_end(block_hash)
        return entry

    def insert(
        self, block_hash: int, parent_hash: int | None, token_ids: tuple[int, ...]
    ) -> tuple[TierEntry | None, list[TierEntry]]:
        """Cache a block: its new entry (None when every slot is reserved) and the entries
        evicted for its room (at most one)."""
        if block_hash in self._entries:
            self._entries.move_to_end(block_hash)
            return self._entries[block_hash], []
        slot, evicted = self._take()
        if slot is None:
            return None, []
        entry = TierEntry(block_hash, parent_hash, tuple(token_ids), slot)
        self._entries[block_hash] = entry
        self.counters.stores += 1
        return entry, evicted

    def remove(self, block_hash: int) -> TierEntry | None:
        entry = self._entries.pop(block_hash, None)
        if entry is not None:
            self._free.append(entry.slot)
        return entry

    def reserve(self) -> tuple[int | None, list[TierEntry]]:
        """A slot out of the LRU (a swapped block): the slot, None when none is left, and the
        cached entries evicted for it."""
        slot, evicted = self._take()
        if slot is not None:
            self._reserved.add(slot)
        return slot, evicted

    def unreserve(self, slot: int) -> None:
        if slot not in self._reserved:
            raise RuntimeError(f"{self.name} tier slot {slot} is not reserved")
        self._reserved.remove(slot)
        self._free.append(slot)

    def pin(self, slot: int) -> None:
        """Keep the cached entry in `slot` from eviction until `unpin`."""
        if slot in self._pinned:
            raise RuntimeError(f"{self.name} tier slot {slot} is pinned already")
        self._pinned.add(slot)

    def unpin(self, slot: int) -> None:
        self._pinned.remove(slot)

    def audit(self) -> None:
        """RuntimeError unless every slot is exactly one of free, cached or reserved, and
        only cached slots are pinned."""
        cached = [e.slot for e in self._entries.values()]
        slots = [*self._free, *cached, *self._reserved]
        if sorted(slots) != list(range(self.capacity)):
            raise RuntimeError(f"{self.name} tier slots are inconsistent")
        if not self._pinned <= set(cached):
            raise RuntimeError(f"{self.name} tier pins a slot that caches nothing")

    def _take(self) -> tuple[int | None, list[TierEntry]]:
        if self._free:
            return self._free.pop(), []
        oldest = next((e for e in self._entries.values() if e.slot not in self._pinned), None)
        if oldest is None:
            return None, []
        del self._entries[oldest.block_hash]
        self.counters.evictions += 1
        return oldest.slot, [oldest]
