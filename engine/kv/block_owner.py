"""What the block manager reads and writes of a request: its id, its block table, its token
counts and ids, the hash root of its chain and its swapped copies
(``engine.scheduler.request.Request`` is one). Integers and token ids only."""

from __future__ import annotations

from typing import Protocol


class BlockOwner(Protocol):
    request_id: str
    block_ids: list[int]  # its block table, grown and emptied by the block manager
    num_computed_tokens: int  # tokens whose KV is in the cache
    num_cached_tokens: int  # of those, found in the prefix cache at admission
    num_released_blocks: int  # leading table entries given back behind a sliding window
    swapped_slots: list[int]  # host-tier slots of a swapped-out request's blocks

    @property
    def hash_root(self) -> int | None:
        """The parent hash of its first block (a LoRA adapter's root, or None)."""
        ...

    @property
    def num_tokens(self) -> int:
        """Its tokens, counting the pending ones."""
        ...

    @property
    def num_known_tokens(self) -> int:
        """Its tokens whose ids are known."""
        ...

    @property
    def all_token_ids(self) -> list[int]: ...
