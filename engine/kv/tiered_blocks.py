"""The block manager with KV tiers below the device (engine.kv.tier_book): prefix blocks found
in host memory or on disk by the same chained hash, cached blocks written behind, preempted
requests swapped out and back. Integers only: the copies are orders for the engine's copier.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.kv.block_manager import BlockManager, _Block, _Chain
from engine.kv.block_owner import BlockOwner
from engine.kv.tier_book import TierBook, TierHit
from models.block_hash import block_hash


class TieredBlockManager(BlockManager):
    """A BlockManager whose prefix cache reaches into lower tiers and whose preemption may
    swap. `tiers` holds their indexes and the copy orders."""

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool, tiers: TierBook
    ) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.tiers = tiers
        tiers.on_moved = self._gone_below
        self._swapping = False

    def lower_blocks(self) -> list[tuple[int, int | None, str]]:
        """(hash, parent hash, tier) of every block held below the device and not on it: with
        cached_blocks(), a snapshot of every tier."""
        out: list[tuple[int, int | None, str]] = []
        seen = set(self._cached)
        for tier in self.tiers.tiers:
            for entry in tier.entries():
                if entry.block_hash not in seen:
                    seen.add(entry.block_hash)
                    out.append((entry.block_hash, entry.parent_hash, tier.name))
        return out

    def match_lower(
        self, token_ids: Sequence[int], device_hits: Sequence[int], root: int | None = None
    ) -> list[TierHit]:
        """The full blocks after `device_hits` found in a lower tier (moved up their LRU)."""
        if not self._caching:
            return []
        size = self._block_size
        parent = self._blocks[device_hits[-1]].hash if device_hits else root
        hits: list[TierHit] = []
        for i in range(len(device_hits), (len(token_ids) - 1) // size):
            tokens = tuple(token_ids[i * size : (i + 1) * size])
            digest = block_hash(parent, tokens)
            if digest in self._cached:
                break  # on the device under a chain that missed: recompute from here
            hit = self.tiers.find(digest, tokens, parent)
            if hit is None:
                break
            hits.append(hit)
            parent = digest
        return hits

    def swap_out(self, request: BlockOwner) -> bool:
        if request.num_released_blocks:  # placeholders hold other requests' KV: recompute
            return False
        slots = self.tiers.swap_out(list(request.block_ids)) if request.block_ids else None
        if slots is None:
            return False
        self._swapping = True  # its blocks are copied already: no write-behind
        try:
            self.free(request)
        finally:
            self._swapping = False
        request.swapped_slots = slots
        return True

    def swap_in(self, request: BlockOwner, num_tokens: int) -> bool:
        """Its leading full blocks still cached on the device are shared again; the other
        swapped blocks are copied back into fresh ones."""
        slots = request.swapped_slots
        if not slots or request.block_ids:
            raise RuntimeError(f"request {request.request_id} is not swapped out")
        full = min(request.num_computed_tokens // self._block_size, len(slots))
        matched = self.match_prefix(request.all_token_ids, request.hash_root)
        hits = [self._blocks[b] for b in matched[:full]]
        num_new = max(self.blocks_for(num_tokens), len(slots)) - len(hits)
        if num_new + sum(1 for b in hits if b.ref_count == 0) > self.num_free_blocks:
            return False
        for block in hits:
            if block.ref_count == 0:
                del self._evictable[block.block_id]
            block.ref_count += 1
        new = [self._take() for _ in range(num_new)]
        request.block_ids = [b.block_id for b in hits] + new
        self.tiers.release(slots[: len(hits)])
        self.tiers.swap_in(slots[len(hits) :], new)
        request.swapped_slots = []
        if self._caching:  # its full blocks are cached again
            hashes = [b.hash for b in hits if b.hash is not None]
            chain = _Chain(hashes, [b.serial for b in hits], root=request.hash_root)
            self._chains[request.request_id] = chain
            self.commit_full_blocks(request)
        return True

    def free(self, request: BlockOwner) -> None:
        """Drop the request's blocks, and its swapped copies when it is swapped out."""
        super().free(request)
        if request.swapped_slots:
            self.tiers.release(request.swapped_slots)
            request.swapped_slots = []

    def forget(self, block_id: int) -> None:
        """The block's content is not what its hash says (a failed load): out of the cache."""
        self._unregister(self._blocks[block_id])

    def audit(self, block_tables: Iterable[Sequence[int]]) -> None:
        super().audit(block_tables)
        self.tiers.audit()

    # ---- hooks ------------------------------------------------------------------------------

    def _fill(self, block_id: int, hit: TierHit) -> None:
        self.tiers.load(hit, block_id)

    def _cacheable(self, block: _Block) -> None:
        if not self._swapping and block.hash is not None:
            self.tiers.save(block.block_id, block.hash, block.parent_hash, block.token_ids)

    def _reclaimed(self, block: _Block) -> None:
        self.tiers.device_evicted(block.block_id)

    def _gone(self, block_hash: int, parent_hash: int | None) -> None:
        if self.events is None:
            return
        tier = self.tiers.where(block_hash)
        if tier is None:
            self.events.removed(block_hash)
        else:
            self.events.stored(block_hash, parent_hash, tier)

    def _gone_below(self, block_hash: int, parent_hash: int | None) -> None:
        if block_hash not in self._cached:
            self._gone(block_hash, parent_hash)
