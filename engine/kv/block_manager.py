"""KV block bookkeeping: reference-counted blocks and a prefix cache of full blocks.

Integers only; the KV tensor lives in the runner. Every full, computed block may be registered
under a chained content hash (its parent's hash and its own token ids). A later request whose
leading blocks hash the same reuses them instead of recomputing. A hit is confirmed by
comparing the stored token ids and the parent block's registration, so a hash collision is a
miss, never a wrong answer.

A block is in exactly one of three places:
- owned: ref count > 0, listed in the block tables of that many requests;
- free: ref count 0, holds nothing reusable;
- evictable: ref count 0, still registered in the prefix cache, reclaimed in LRU order.

Requests release their blocks tail first, so a shared prefix outlives the suffixes built on it.

Tiers below the device (host memory, disk) plug into the hooks by subclassing
(engine.kv.tiered_blocks); without them the hooks do nothing.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from engine.kv.block_audit import audit_blocks
from engine.kv.block_owner import BlockOwner
from engine.kv.events import KVEventLog
from engine.kv.tier_book import TierHit
from models.block_hash import block_hash

_ROOT_SERIAL = 0  # the "parent" of a request's first block


@dataclass
class _Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set while registered in the prefix cache
    token_ids: tuple[int, ...] = ()
    serial: int = _ROOT_SERIAL  # unique per registration, never reused
    parent_serial: int = _ROOT_SERIAL
    parent_hash: int | None = None


@dataclass
class _Chain:
    """(hash, serial) of each of a request's leading full blocks known to the cache."""

    hashes: list[int] = field(default_factory=list)
    serials: list[int] = field(default_factory=list)
    broken: bool = False  # a hash collision stopped registration for this request
    root: int | None = None  # the first block's parent hash (a LoRA adapter's root)


class BlockManager:
    """Hands out KV blocks to requests and keeps a prefix cache of full blocks."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"BlockManager num_blocks must be an integer >= 1, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"BlockManager block_size must be an integer >= 1, got {block_size!r}")
        self._block_size = block_size
        self._caching = enable_prefix_caching
        self._blocks = [_Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._cached: dict[int, int] = {}  # hash -> block id
        self._chains: dict[str, _Chain] = {}
        self._serials = itertools.count(_ROOT_SERIAL + 1)
        self.num_prefix_hit_tokens = 0  # tokens found in the cache at admission, in total
        self.num_prefix_query_tokens = 0  # tokens looked up at admission, in total
        self.events: KVEventLog | None = None  # see record_events

    # ---- sizes --------------------------------------------------------------------------

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_total_blocks(self) -> int:
        return len(self._blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: free ones plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, owned or evictable."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks owned by requests, in [0, 1]."""
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold num_tokens tokens."""
        return -(-num_tokens // self._block_size)

    def record_events(self, capacity: int) -> KVEventLog:
        """Record blocks stored in and evicted from the prefix cache from now on."""
        if self.events is None:
            self.events = KVEventLog(capacity)
        return self.events

    def cached_blocks(self) -> list[tuple[int, int | None]]:
        """(hash, parent hash) of every block in the prefix cache: a snapshot of it."""
        return [(h, self._blocks[b].parent_hash) for h, b in self._cached.items()]

    # ---- the request-facing API ---------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int], root: int | None = None) -> list[int]:
        """Cached blocks holding the leading full blocks of token_ids, in order. No side effects.

        At least one token is always left to compute: the match stops below len(token_ids).
        `root`: the chain's start (``BlockOwner.hash_root``: a LoRA adapter's).
        """
        if not self._caching:
            return []
        hits: list[int] = []
        parent_hash: int | None = root
        parent_serial = _ROOT_SERIAL
        for i in range((len(token_ids) - 1) // self._block_size):
            tokens = tuple(token_ids[i * self._block_size : (i + 1) * self._block_size])
            digest = block_hash(parent_hash, tokens)
            block = self._lookup(digest, tokens, parent_serial)
            if block is None:
                break
            hits.append(block.block_id)
            parent_hash, parent_serial = digest, block.serial
        return hits

    def match_lower(
        self, token_ids: Sequence[int], device_hits: Sequence[int], root: int | None = None
    ) -> list[TierHit]:
        """The leading full blocks of token_ids found below the device, after `device_hits`
        (match_prefix's result, from the same `root`), moved up their tier's LRU; none without
        lower tiers."""
        return []

    def allocate(
        self,
        request: BlockOwner,
        num_tokens: int,
        prefix_block_ids: Sequence[int] = (),
        lower: Sequence[TierHit] = (),
    ) -> bool:
        """Grow request.block_ids to hold num_tokens tokens; False (nothing changed) if short.

        First admission (the request holds no blocks) may pass prefix_block_ids, the result of
        match_prefix just before: those blocks are shared, and request.num_cached_tokens and
        request.num_computed_tokens are set to the tokens they hold; `lower` (match_lower's
        result) is loaded into fresh blocks before the next step, counted cached too.
        """
        first = not request.block_ids
        hits = [self._blocks[b] for b in prefix_block_ids]
        self._check_prefix(request, num_tokens, len(hits) + len(lower), first)
        if any(b.hash is None for b in hits):
            raise ValueError(f"request {request.request_id}: prefix blocks are not cached")
        num_new = max(0, self.blocks_for(num_tokens) - len(request.block_ids) - len(hits))
        num_revived = sum(1 for b in hits if b.ref_count == 0)
        if num_new + num_revived > self.num_free_blocks:
            return False
        if first:
            self._admit(request, hits, lower)
        request.block_ids.extend(self._take() for _ in range(num_new - len(lower)))
        return True

    def swap_out(self, request: BlockOwner) -> bool:
        """Preemption: keep the request's KV in a lower tier, free its blocks; False (nothing
        changed) when it cannot (always, without tiers)."""
        return False

    def swap_in(self, request: BlockOwner, num_tokens: int) -> bool:
        """Readmit a swapped-out request (blocks for num_tokens, its KV copied back); False
        (nothing changed) when short of blocks."""
        raise RuntimeError(f"request {request.request_id} was not swapped out")

    def commit_full_blocks(self, request: BlockOwner) -> None:
        """Register the request's blocks that are now full and computed in the prefix cache."""
        chain = self._chains.get(request.request_id)
        if chain is None or chain.broken:
            return
        computed = min(request.num_computed_tokens, request.num_known_tokens)
        num_full = min(computed // self._block_size, len(request.block_ids))
        if len(chain.hashes) >= num_full:
            return
        tokens = request.all_token_ids
        size = self._block_size
        for i in range(len(chain.hashes), num_full):
            block = self._blocks[request.block_ids[i]]
            if not self._register(chain, block, tuple(tokens[i * size : (i + 1) * size])):
                chain.broken = True
                return

    def free(self, request: BlockOwner) -> None:
        """Drop the request's references, last block first; request.block_ids becomes empty."""
        for block_id in reversed(request.block_ids[request.num_released_blocks :]):
            if self._blocks[block_id].ref_count < 1:
                raise RuntimeError(f"block {block_id} freed by {request.request_id} is not owned")
            self._release(block_id)
        request.block_ids = []
        request.num_released_blocks = 0
        self._chains.pop(request.request_id, None)

    def release_behind(self, request: BlockOwner, first_needed: int) -> None:
        """Give back the request's leading blocks holding only positions before
        ``first_needed``: no query of a model whose every layer has a sliding window reads
        them again. Their table entries stay, as placeholders no kernel reads; a cached block
        stays in the prefix cache (evictable), with the content its hash names."""
        done = request.num_released_blocks
        behind = min(first_needed // self._block_size, len(request.block_ids) - 1)
        for i in range(done, behind):
            self._release(request.block_ids[i])
        request.num_released_blocks = max(done, behind)

    def trim(self, request: BlockOwner, num_tokens: int) -> None:
        """Give back the request's blocks past those holding num_tokens tokens, last first
        (the slots of rejected speculative tokens)."""
        keep = self.blocks_for(num_tokens)
        while len(request.block_ids) > keep:
            self._release(request.block_ids.pop())

    def audit(self, block_tables: Iterable[Sequence[int]]) -> None:
        """Check every invariant against the block tables (the owned blocks) of all live
        requests. Raises RuntimeError naming the first violation. Meant for tests and
        debugging (engine.kv.block_audit)."""
        audit_blocks(self._blocks, self._free, self._evictable, self._cached, block_tables)

    # ---- internals ----------------------------------------------------------------------

    def _check_prefix(
        self, request: BlockOwner, num_tokens: int, num_hits: int, first: bool
    ) -> None:
        if not num_hits:
            return
        if not first:
            raise ValueError(f"request {request.request_id}: prefix blocks only at admission")
        if num_tokens <= num_hits * self._block_size:
            raise ValueError(
                f"request {request.request_id}: num_tokens {num_tokens} must exceed the "
                f"{num_hits * self._block_size} cached tokens"
            )

    def _admit(self, request: BlockOwner, hits: list[_Block], lower: Sequence[TierHit]) -> None:
        for block in hits:
            if block.ref_count == 0:
                del self._evictable[block.block_id]
            block.ref_count += 1
            request.block_ids.append(block.block_id)
        chain = _Chain(
            hashes=[b.hash for b in hits if b.hash is not None],
            serials=[b.serial for b in hits],
            root=request.hash_root,
        )
        for hit in lower:  # fresh blocks, filled from below, cached like computed ones
            block = self._blocks[self._take()]
            request.block_ids.append(block.block_id)
            self._fill(block.block_id, hit)
            if not chain.broken and not self._register(chain, block, hit.entry.token_ids):
                chain.broken = True
        cached = (len(hits) + len(lower)) * self._block_size
        request.num_cached_tokens = cached
        request.num_computed_tokens = cached
        if self._caching:
            self._chains[request.request_id] = chain
            self.num_prefix_hit_tokens += cached
            self.num_prefix_query_tokens += request.num_tokens

    def _fill(self, block_id: int, hit: TierHit) -> None:  # tiers: load a lower-tier hit
        raise RuntimeError(f"no tier below the device to load {hit.tier} block from")

    def _cacheable(self, block: _Block) -> None:  # tiers: a cached block lost its last owner
        pass

    def _reclaimed(self, block: _Block) -> None:  # tiers: a cached block is to be reused
        pass

    def _gone(self, block_hash: int, parent_hash: int | None) -> None:
        """A block left the device cache (tiers: it may live on below)."""
        if self.events is not None:
            self.events.removed(block_hash)

    def _release(self, block_id: int) -> None:
        block = self._blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.hash is None:
                self._free.append(block_id)
            else:
                self._evictable[block_id] = None
                self._cacheable(block)

    def _take(self) -> int:
        if self._free:
            block_id = self._free.popleft()
        else:
            block_id, _ = self._evictable.popitem(last=False)
            self._reclaimed(self._blocks[block_id])
            self._unregister(self._blocks[block_id])
        self._blocks[block_id].ref_count = 1
        return block_id

    def _lookup(self, digest: int, tokens: tuple[int, ...], parent_serial: int) -> _Block | None:
        block_id = self._cached.get(digest)
        if block_id is None:
            return None
        block = self._blocks[block_id]
        if block.token_ids != tokens or block.parent_serial != parent_serial:
            return None  # hash collision
        return block

    def _register(self, chain: _Chain, block: _Block, tokens: tuple[int, ...]) -> bool:
        """Extend the chain by one block; False on a hash collision with other content."""
        parent_hash = chain.hashes[-1] if chain.hashes else chain.root
        parent_serial = chain.serials[-1] if chain.serials else _ROOT_SERIAL
        digest = block_hash(parent_hash, tokens)
        if digest not in self._cached:
            block.hash, block.token_ids = digest, tokens
            block.serial, block.parent_serial = next(self._serials), parent_serial
            block.parent_hash = parent_hash
            self._cached[digest] = block.block_id
            if self.events is not None:
                self.events.stored(digest, parent_hash)
            serial = block.serial
        else:
            twin = self._lookup(digest, tokens, parent_serial)
            if twin is None:
                return False
            serial = twin.serial  # same content computed twice: keep the first copy cached
        chain.hashes.append(digest)
        chain.serials.append(serial)
        return True

    def _unregister(self, block: _Block) -> None:
        if block.hash is not None and self._cached.get(block.hash) == block.block_id:
            del self._cached[block.hash]
            self._gone(block.hash, block.parent_hash)
        block.hash, block.token_ids, block.parent_hash = None, (), None
        block.serial = block.parent_serial = _ROOT_SERIAL
