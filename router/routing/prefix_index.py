"""The router's cluster-wide prefix index: block hash -> the nodes whose cache holds it.

Fed by the nodes' KV events (cluster.kv_event_reader); asked, per request, how many leading
blocks of its prompt each candidate node holds. The index may lag or miss events: a node
it names may have evicted a block (the node then computes it: a miss, never a wrong answer),
and a block it lacks only costs a routing opportunity. A node's entries go when the node
leaves the membership, and are replaced when it restarts (a new incarnation) or publishes a
snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cluster.kv_events import KVEventMsg
from models.block_hash import adapter_hash_root, prefix_block_hashes

DEVICE = "device"


@dataclass
class _NodeCache:
    incarnation: str
    block_size: int
    hashes: set[int] = field(default_factory=set)  # in any tier
    lower: dict[int, str] = field(default_factory=dict)  # of those, held only below the device


class PrefixQuery:
    """One request's token ids, hashed once per block size that is asked for; under a LoRA
    adapter (`adapter`: its name) the chain starts from the adapter's root, as the nodes'."""

    def __init__(self, token_ids: Sequence[int], adapter: str | None = None) -> None:
        self.token_ids = token_ids
        self._root = adapter_hash_root(adapter) if adapter is not None else None
        self._hashes: dict[int, list[int]] = {}

    def hashes(self, block_size: int) -> list[int]:
        if block_size not in self._hashes:
            self._hashes[block_size] = prefix_block_hashes(self.token_ids, block_size, self._root)
        return self._hashes[block_size]

    def reusable_tokens(self, num_blocks: int, block_size: int) -> int:
        """Tokens a node skips with `num_blocks` leading blocks cached: like the engine, it
        always computes at least the last prompt token."""
        return min(num_blocks, (len(self.token_ids) - 1) // block_size) * block_size


class PrefixIndex:
    """Block hash -> node ids, with each node's own set; a KVEventSink."""

    def __init__(self) -> None:
        self._nodes: dict[str, _NodeCache] = {}
        self._holders: dict[int, set[str]] = {}

    def apply(self, msg: KVEventMsg) -> None:
        node = self._nodes.get(msg.node_id)
        fresh = node is None or node.incarnation != msg.incarnation
        if fresh or msg.snapshot or node is None or node.block_size != msg.block_size:
            self.drop(msg.node_id)
            node = self._nodes[msg.node_id] = _NodeCache(msg.incarnation, msg.block_size)
        for block_hash in msg.removed:
            self._discard(msg.node_id, node, block_hash)
        for block_hash, _parent in msg.stored:
            self._add(msg.node_id, node, block_hash, DEVICE)
        for block_hash, _parent, tier in msg.lower:
            self._add(msg.node_id, node, block_hash, tier)

    def drop(self, node_id: str) -> None:
        node = self._nodes.pop(node_id, None)
        for block_hash in node.hashes if node is not None else ():
            self._discard(node_id, None, block_hash)

    def num_blocks(self, node_ids: Iterable[str] | None = None) -> int:
        """Blocks known for these nodes (all when None), counted per node."""
        ids = self._nodes.keys() if node_ids is None else node_ids
        return sum(len(self._nodes[n].hashes) for n in ids if n in self._nodes)

    def nodes(self) -> list[str]:
        return sorted(self._nodes)

    def matched_tokens(self, query: PrefixQuery, node_ids: Iterable[str]) -> dict[str, int]:
        """Prompt tokens each node could take from its cache (its leading matched blocks);
        nodes the index does not know get 0."""
        out = dict.fromkeys(node_ids, 0)
        sizes = {self._nodes[n].block_size for n in out if n in self._nodes}
        for size in sizes:
            alive = {n for n in out if n in self._nodes and self._nodes[n].block_size == size}
            for depth, block_hash in enumerate(query.hashes(size)):
                holders = alive & self._holders.get(block_hash, set())
                for node_id in alive - holders:
                    out[node_id] = query.reusable_tokens(depth, size)
                alive = holders
                if not alive:
                    break
            for node_id in alive:
                out[node_id] = query.reusable_tokens(len(query.hashes(size)), size)
        return out

    def matched_tiers(
        self, query: PrefixQuery, node_ids: Iterable[str]
    ) -> dict[str, dict[str, int]]:
        """Per node, the prompt tokens of its leading matched blocks by the tier holding them
        ("device", "host", "disk"); nodes the index does not know get {}."""
        out: dict[str, dict[str, int]] = {}
        for node_id in node_ids:
            node, counts = self._nodes.get(node_id), out.setdefault(node_id, {})
            if node is None:
                continue
            usable = query.reusable_tokens(len(query.token_ids), node.block_size)
            for block_hash in query.hashes(node.block_size)[: usable // node.block_size]:
                if block_hash not in node.hashes:
                    break
                tier = node.lower.get(block_hash, DEVICE)
                counts[tier] = counts.get(tier, 0) + node.block_size
        return out

    def _add(self, node_id: str, node: _NodeCache, block_hash: int, tier: str) -> None:
        node.hashes.add(block_hash)
        if tier == DEVICE:
            node.lower.pop(block_hash, None)
        else:
            node.lower[block_hash] = tier
        self._holders.setdefault(block_hash, set()).add(node_id)

    def _discard(self, node_id: str, node: _NodeCache | None, block_hash: int) -> None:
        if node is not None:
            node.hashes.discard(block_hash)
            node.lower.pop(block_hash, None)
        holders = self._holders.get(block_hash)
        if holders is not None:
            holders.discard(node_id)
            if not holders:
                del self._holders[block_hash]
