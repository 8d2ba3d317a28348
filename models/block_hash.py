"""The chained content hash of a full KV block, shared by the engine and the router.

A block's hash covers its parent's hash and its own token ids, so equal hashes name equal
prefixes. The engine's prefix cache registers blocks under these hashes; nodes publish them
as KV events; the router hashes a request's token ids the same way to ask which node holds
its prefix. A request under a LoRA adapter starts its chain from the adapter's root
(``adapter_hash_root``), so no block is shared across adapters or with the base model.
Torch-free and stable across processes, machines and Python versions.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def block_hash(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """64-bit hash of one block's token ids, chained on its parent's (None: first block)."""
    digest = hashlib.blake2b(digest_size=8)
    if parent_hash is not None:
        digest.update(parent_hash.to_bytes(8, "little"))
    digest.update(array("q", token_ids).tobytes())
    return int.from_bytes(digest.digest(), "little")


def adapter_hash_root(adapter_name: str) -> int:
    """The parent hash of the first block of a request under the named LoRA adapter."""
    digest = hashlib.blake2b(b"lora-adapter\0" + adapter_name.encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def prefix_block_hashes(
    token_ids: Sequence[int], block_size: int, root: int | None = None
) -> list[int]:
    """The chained hashes of every full block of `token_ids`, in order (a partial tail block
    has none); `root`: the first block's parent (an adapter's, ``adapter_hash_root``)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    hashes: list[int] = []
    parent: int | None = root
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes
