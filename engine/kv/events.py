"""What changed in a prefix cache since the last look: blocks stored and blocks evicted.

The block manager records each registration and eviction here (engine thread); a node drains
the log between steps and publishes it (cluster.kv_events). Only the net change per block
hash is kept, so a block stored and evicted between two drains costs one entry, and the log
holds at most one entry per distinct hash. Past `capacity` entries it stops recording and
says so: the reader must then take a full snapshot of the cache instead.

With KV tiers below the device (engine.kv.tier_book) a block is stored in the fastest tier
that holds it: "device", "host" or "disk"; it is removed once no tier holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KVChanges:
    """Net changes since the previous drain. `stored` holds (hash, parent hash or None) of
    blocks now on the device; `lower` holds (hash, parent hash or None, tier) of blocks now
    only in a lower tier ("host" or "disk"); `removed` is disjoint from both. `overflowed`:
    changes were lost, take a snapshot."""

    stored: list[tuple[int, int | None]]
    removed: list[int]
    overflowed: bool = False
    lower: list[tuple[int, int | None, str]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.stored or self.removed or self.lower or self.overflowed)


_REMOVED = object()
DEVICE = "device"


class KVEventLog:
    """Bounded log of prefix-cache changes; one thread records and drains it."""

    def __init__(self, capacity: int = 1 << 16) -> None:
        if capacity < 1:
            raise ValueError(f"KVEventLog capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        # hash -> (parent hash, tier) or _REMOVED
        self._changes: dict[int, tuple[int | None, str] | object] = {}
        self._overflowed = False

    def stored(self, block_hash: int, parent_hash: int | None, tier: str = DEVICE) -> None:
        self._record(block_hash, (parent_hash, tier))

    def removed(self, block_hash: int) -> None:
        self._record(block_hash, _REMOVED)

    def drain(self) -> KVChanges:
        """The net changes since the last drain; the log starts empty again."""
        stored: list[tuple[int, int | None]] = []
        lower: list[tuple[int, int | None, str]] = []
        removed: list[int] = []
        for block_hash, change in self._changes.items():
            if not isinstance(change, tuple):
                removed.append(block_hash)
            elif change[1] == DEVICE:
                stored.append((block_hash, change[0]))
            else:
                lower.append((block_hash, change[0], change[1]))
        out = KVChanges(stored, removed, self._overflowed, lower)
        self._changes, self._overflowed = {}, False
        return out

    def _record(self, block_hash: int, change: tuple[int | None, str] | object) -> None:
        if self._overflowed:
            return
        self._changes.pop(block_hash, None)  # re-insert: keeps the latest change last
        if len(self._changes) >= self.capacity:
            self._changes.clear()
            self._overflowed = True
            return
        self._changes[block_hash] = change
