"""A tensor-parallel node's KV cache as one tensor per rank, each holding a range of heads.

Every rank's tensor is block-major, ``[num_blocks, layers, 2, block_size, heads, head_dim]``
with its own number of heads, and all share the block ids (one scheduler). Rank 0's process
holds every rank's tensor (shared memory on the CPU, CUDA IPC on GPUs), so one transfer
agent moves every rank's heads. A head range of a block is ``layers * 2 * block_size`` runs
of ``heads * head_dim`` elements; the wire carries a range as ``[blocks, layers, 2,
block_size, heads, head_dim]``, each head from the first rank that holds it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kv_transfer.head_plan import HeadSpan, LocalCopy, Piece, RankShard


class KVShards:
    """The per-rank KV tensors of one node and the global heads each holds."""

    def __init__(
        self, tensors: Sequence[torch.Tensor], spans: Sequence[HeadSpan], num_kv_heads: int
    ) -> None:
        if len(tensors) != len(spans) or not tensors:
            raise ValueError(f"{len(tensors)} KV tensors for {len(spans)} head ranges")
        first = tensors[0]
        for rank, (t, span) in enumerate(zip(tensors, spans, strict=True)):
            if t.dim() != 6 or t.shape[4] != span.length or not t.is_contiguous():
                raise ValueError(
                    f"rank {rank}'s KV tensor {tuple(t.shape)} is not a contiguous "
                    f"[blocks, layers, 2, block_size, {span.length}, head_dim] cache"
                )
            if t.shape[:4] != first.shape[:4] or t.shape[5] != first.shape[5]:
                raise ValueError(f"rank {rank}'s KV tensor {tuple(t.shape)} differs from rank 0's")
            if t.dtype != first.dtype:
                raise ValueError(f"rank {rank}'s KV dtype {t.dtype} differs from rank 0's")
        self.tensors = list(tensors)
        self.spans = [HeadSpan(*s) for s in spans]
        self.num_kv_heads = num_kv_heads
        self.rows_per_block = int(first.shape[1] * first.shape[2] * first.shape[3])
        self.head_bytes = int(first.shape[5]) * first.element_size()

    @property
    def size(self) -> int:
        return len(self.tensors)

    def span_bytes(self, heads: int, num_blocks: int) -> int:
        """Bytes of ``heads`` heads of ``num_blocks`` blocks."""
        return num_blocks * self.rows_per_block * heads * self.head_bytes

    def rank_shards(self) -> tuple[RankShard, ...]:
        return tuple(
            RankShard(
                span.start,
                span.length,
                t.data_ptr(),
                t[0].numel() * t.element_size(),
                (t.device.index or 0) if t.device.type == "cuda" else 0,
            )
            for t, span in zip(self.tensors, self.spans, strict=True)
        )

    def gather(self, block_ids: Sequence[int], heads: HeadSpan) -> torch.Tensor:
        """Global ``heads`` of ``block_ids``, each from the first rank holding it, on the
        host: [blocks, layers, 2, block_size, heads.length, head_dim]."""
        parts = []
        index = torch.tensor(list(block_ids), dtype=torch.long)
        head = heads.start
        while head < heads.stop:
            rank = next(r for r, s in enumerate(self.spans) if s.start <= head < s.stop)
            span = self.spans[rank]
            stop = min(span.stop, heads.stop)
            t = self.tensors[rank]
            lo, hi = head - span.start, stop - span.start
            parts.append(t[index.to(t.device), :, :, :, lo:hi].cpu())
            head = stop
        return torch.cat(parts, dim=4).contiguous()

    def scatter(
        self, rank: int, block_ids: Sequence[int], heads: HeadSpan, data: torch.Tensor
    ) -> None:
        """Write ``data`` [blocks, layers, 2, block_size, heads.length, head_dim] into rank
        ``rank``'s ``block_ids`` at global ``heads``."""
        t, span = self.tensors[rank], self.spans[rank]
        lo = heads.start - span.start
        index = torch.tensor(list(block_ids), dtype=torch.long, device=t.device)
        t[index, :, :, :, lo : lo + heads.length] = data.to(t.device)

    def copy(self, copy: LocalCopy, block_ids: Sequence[int]) -> None:
        """A replicated head from one local rank to another, same blocks."""
        src, src_span = self.tensors[copy.src], self.spans[copy.src]
        lo = copy.heads.start - src_span.start
        index = torch.tensor(list(block_ids), dtype=torch.long, device=src.device)
        data = src[index, :, :, :, lo : lo + copy.heads.length]
        self.scatter(copy.dst, block_ids, copy.heads, data)

    def synchronize(self) -> None:
        for t in self.tensors:
            if t.device.type == "cuda":
                torch.cuda.synchronize(t.device)


def piece_descriptors(
    shard: RankShard,
    rows_per_block: int,
    head_bytes: int,
    block_ids: Sequence[int],
    heads: HeadSpan,
) -> np.ndarray:
    """[blocks * rows_per_block, 3] uint64 rows (address, length, device id): global
    ``heads`` of ``block_ids`` in ``shard``'s tensor, block by block, row by row."""
    row_bytes = shard.length * head_bytes
    offset = (heads.start - shard.start) * head_bytes
    blocks = np.asarray(block_ids, dtype=np.uint64) * np.uint64(shard.block_bytes)
    rows = np.arange(rows_per_block, dtype=np.uint64) * np.uint64(row_bytes)
    addresses = np.uint64(shard.base_address + offset) + (blocks[:, None] + rows[None, :])
    out = np.empty((addresses.size, 3), dtype=np.uint64)
    out[:, 0] = addresses.reshape(-1)
    out[:, 1] = heads.length * head_bytes
    out[:, 2] = shard.device_id
    return out


def read_descriptors(
    local: KVShards,
    remote: Sequence[RankShard],
    piece: Piece,
    remote_ids: Sequence[int],
    local_ids: Sequence[int],
) -> tuple[np.ndarray, np.ndarray]:
    """(local rows, remote rows) of one piece, pairwise."""
    mine = local.rank_shards()[piece.dst]
    args = (local.rows_per_block, local.head_bytes)
    return (
        piece_descriptors(mine, *args, local_ids, piece.heads),
        piece_descriptors(remote[piece.src], *args, remote_ids, piece.heads),
    )
