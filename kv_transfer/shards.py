"""A multi-rank node's KV cache as one tensor per rank, each holding layers x KV heads.

Every rank's tensor is block-major, ``[num_blocks, layers, 2, block_size, heads, head_dim]``
with its own number of layers (its pipeline stage's) and heads (its tensor-parallel share),
and all share the block ids (one scheduler). Rank 0's process holds every rank's tensor
(shared memory on the CPU, CUDA IPC on GPUs), so one transfer agent plans and moves every
rank's part; over TCP each sending rank's cells travel on their own connection (from the
rank's own listener where it runs one), all at once.
A piece (layers x heads) of a block is ``layers * 2 * block_size`` runs of ``heads *
head_dim`` elements (one run per layer, K or V, and token; neighbouring runs merge when the
piece spans the rank's every head); the wire carries a piece as ``[blocks, layers, 2,
block_size, heads, head_dim]``, each cell from the first rank that holds it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kv_transfer.head_plan import HeadPlan, HeadSpan, LayerSpan, LocalCopy, Piece, RankKV, RankShard


class KVShards:
    """The per-rank KV tensors of one node and the global layers and heads each holds
    (``layers`` None: every rank holds every layer, one stage)."""

    def __init__(
        self,
        tensors: Sequence[torch.Tensor],
        spans: Sequence[HeadSpan],
        num_kv_heads: int,
        layers: Sequence[LayerSpan] | None = None,
    ) -> None:
        if len(tensors) != len(spans) or not tensors:
            raise ValueError(f"{len(tensors)} KV tensors for {len(spans)} head ranges")
        if layers is None:
            layers = [LayerSpan(0, int(tensors[0].shape[1]))] * len(tensors)
        if len(layers) != len(tensors):
            raise ValueError(f"{len(tensors)} KV tensors for {len(layers)} layer ranges")
        first = tensors[0]
        for rank, (t, span, held) in enumerate(zip(tensors, spans, layers, strict=True)):
            if t.dim() != 6 or t.shape[4] != span.length or t.shape[1] != held[1]:
                raise ValueError(
                    f"rank {rank}'s KV tensor {tuple(t.shape)} is not a "
                    f"[blocks, {held[1]}, 2, block_size, {span.length}, head_dim] cache"
                )
            if not t.is_contiguous():
                raise ValueError(f"rank {rank}'s KV tensor is not contiguous")
            same = (t.shape[0], *t.shape[2:4], t.shape[5])
            if same != (first.shape[0], *first.shape[2:4], first.shape[5]):
                raise ValueError(f"rank {rank}'s KV tensor {tuple(t.shape)} differs from rank 0's")
            if t.dtype != first.dtype:
                raise ValueError(f"rank {rank}'s KV dtype {t.dtype} differs from rank 0's")
        self.tensors = list(tensors)
        self.spans = [HeadSpan(*s) for s in spans]
        self.layers = [LayerSpan(*s) for s in layers]
        self.num_kv_heads = num_kv_heads
        self.num_layers = max(s.stop for s in self.layers)
        self.layer_rows = int(first.shape[2] * first.shape[3])  # K and V rows of one layer
        self.head_bytes = int(first.shape[5]) * first.element_size()

    @property
    def size(self) -> int:
        return len(self.tensors)

    @property
    def parts(self) -> list[RankKV]:
        return [RankKV(la, h) for la, h in zip(self.layers, self.spans, strict=True)]

    def piece_bytes(self, heads: int, layers: int, num_blocks: int) -> int:
        """Bytes of ``layers`` layers x ``heads`` heads of ``num_blocks`` blocks."""
        return num_blocks * layers * self.layer_rows * heads * self.head_bytes

    def plan_bytes(self, plan: HeadPlan, num_blocks: int) -> int:
        """Bytes the plan's reads move for ``num_blocks`` blocks (each cell once)."""
        return num_blocks * plan.cells_moved() * self.layer_rows * self.head_bytes

    def rank_shards(self) -> tuple[RankShard, ...]:
        return tuple(
            RankShard(
                start=span.start,
                length=span.length,
                base_address=t.data_ptr(),
                block_bytes=t[0].numel() * t.element_size(),
                device_id=(t.device.index or 0) if t.device.type == "cuda" else 0,
                layer_start=held.start,
                num_layers=held.length,
            )
            for t, span, held in zip(self.tensors, self.spans, self.layers, strict=True)
        )

    def holds(self, rank: int, heads: HeadSpan, layers: LayerSpan) -> bool:
        """Whether rank ``rank`` holds every cell of global ``layers`` x ``heads``."""
        span, held = self.spans[rank], self.layers[rank]
        return (
            span.start <= heads.start
            and heads.stop <= span.stop
            and held.start <= layers.start
            and layers.stop <= held.stop
        )

    def block_views(
        self, rank: int, block_ids: Sequence[int], heads: HeadSpan, layers: LayerSpan
    ) -> list[memoryview] | None:
        """Per block, rank ``rank``'s ``layers`` x ``heads`` cells as one view of its
        tensor's own memory (to send from or receive into, no copy), when they are one run:
        the rank's every head, on the host. None otherwise."""
        t, span, held = self.tensors[rank], self.spans[rank], self.layers[rank]
        if t.device.type != "cpu" or heads != span or not self.holds(rank, heads, layers):
            return None
        layer_bytes = t[0, 0].numel() * t.element_size()
        lo, n = (layers.start - held.start) * layer_bytes, layers.length * layer_bytes
        raw = t.view(t.shape[0], -1).view(torch.uint8).numpy()  # [blocks, block_bytes]
        return [raw[b, lo : lo + n].data for b in block_ids]

    def gather_rank(
        self, rank: int, block_ids: Sequence[int], heads: HeadSpan, layers: LayerSpan
    ) -> torch.Tensor:
        """Rank ``rank``'s global ``layers`` x ``heads`` of ``block_ids`` on the host (one
        copy of just these cells): [blocks, layers.length, 2, block_size, heads.length,
        head_dim]."""
        t, span, held = self.tensors[rank], self.spans[rank], self.layers[rank]
        h, la = heads.start - span.start, layers.start - held.start
        index = torch.tensor(list(block_ids), dtype=torch.long, device=t.device)
        cells = t[:, la : la + layers.length, :, :, h : h + heads.length]
        return cells[index].cpu().contiguous()

    def gather(
        self, block_ids: Sequence[int], heads: HeadSpan, layers: LayerSpan | None = None
    ) -> torch.Tensor:
        """Global ``layers`` x ``heads`` of ``block_ids``, each cell from the first rank
        holding it, on the host: [blocks, layers.length, 2, block_size, heads.length,
        head_dim] (every layer when ``layers`` is None)."""
        layers = layers or LayerSpan(0, self.num_layers)
        index = torch.tensor(list(block_ids), dtype=torch.long)
        stages = []
        layer = layers.start
        while layer < layers.stop:
            held = [r for r, s in enumerate(self.layers) if s.start <= layer < s.stop]
            stop = min([layers.stop, *(self.layers[r].stop for r in held)])
            parts = []
            head = heads.start
            while head < heads.stop:
                rank = next(r for r in held if self.spans[r].start <= head < self.spans[r].stop)
                span, first = self.spans[rank], self.layers[rank].start
                end = min(span.stop, heads.stop)
                t = self.tensors[rank]
                cells = t[
                    :, layer - first : stop - first, :, :, head - span.start : end - span.start
                ]
                parts.append(cells[index.to(t.device)].cpu())  # one copy of just these cells
                head = end
            stages.append(_joined(parts, dim=4))
            layer = stop
        return _joined(stages, dim=1).contiguous()

    def scatter(
        self,
        rank: int,
        block_ids: Sequence[int],
        heads: HeadSpan,
        data: torch.Tensor,
        layers: LayerSpan | None = None,
    ) -> None:
        """Write ``data`` [blocks, layers.length, 2, block_size, heads.length, head_dim] into
        rank ``rank``'s ``block_ids`` at global ``layers`` x ``heads`` (its every layer when
        ``layers`` is None)."""
        t, span, held = self.tensors[rank], self.spans[rank], self.layers[rank]
        layers = layers or held
        lo, first = heads.start - span.start, layers.start - held.start
        index = torch.tensor(list(block_ids), dtype=torch.long, device=t.device)
        rows = t[:, first : first + layers.length] if layers != held else t
        rows[index, :, :, :, lo : lo + heads.length] = data.to(t.device)

    def copy(self, copy: LocalCopy, block_ids: Sequence[int]) -> None:
        """A replicated head from one local rank to another, same blocks and layers."""
        src, span, held = self.tensors[copy.src], self.spans[copy.src], self.layers[copy.src]
        lo, first = copy.heads.start - span.start, copy.layers.start - held.start
        index = torch.tensor(list(block_ids), dtype=torch.long, device=src.device)
        data = src[index, first : first + copy.layers.length, :, :, lo : lo + copy.heads.length]
        self.scatter(copy.dst, block_ids, copy.heads, data, copy.layers)

    def synchronize(self) -> None:
        for t in self.tensors:
            if t.device.type == "cuda":
                torch.cuda.synchronize(t.device)


def _joined(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``parts`` concatenated along ``dim``; one part as it is (no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def piece_descriptors(
    shard: RankShard,
    layer_rows: int,
    head_bytes: int,
    block_ids: Sequence[int],
    piece: Piece,
) -> np.ndarray:
    """[blocks * layers * layer_rows, 3] uint64 rows (address, length, device id): the
    piece's global layers x heads of ``block_ids`` in ``shard``'s tensor, block by block,
    row by row."""
    row_bytes = shard.length * head_bytes
    offset = (piece.heads.start - shard.start) * head_bytes
    offset += (piece.layers.start - shard.layer_start) * layer_rows * row_bytes
    blocks = np.asarray(block_ids, dtype=np.uint64) * np.uint64(shard.block_bytes)
    rows = np.arange(piece.layers.length * layer_rows, dtype=np.uint64) * np.uint64(row_bytes)
    addresses = np.uint64(shard.base_address + offset) + (blocks[:, None] + rows[None, :])
    out = np.empty((addresses.size, 3), dtype=np.uint64)
    out[:, 0] = addresses.reshape(-1)
    out[:, 1] = piece.heads.length * head_bytes
    out[:, 2] = shard.device_id
    return out


def read_descriptors(
    local: KVShards,
    remote: Sequence[RankShard],
    piece: Piece,
    remote_ids: Sequence[int],
    local_ids: Sequence[int],
) -> tuple[np.ndarray, np.ndarray]:
    """(local rows, remote rows) of one piece, pairwise; runs that follow each other on
    both sides merged into one row."""
    mine = local.rank_shards()[piece.dst]
    args = (local.layer_rows, local.head_bytes)
    return coalesce(
        piece_descriptors(mine, *args, local_ids, piece),
        piece_descriptors(remote[piece.src], *args, remote_ids, piece),
    )


def coalesce(local: np.ndarray, remote: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairwise rows merged where both the local and the remote row continue the one
    before (same device): a piece of every head of a rank is one row per block."""
    if len(local) < 2:
        return local, remote
    follows = (
        (local[1:, 0] == local[:-1, 0] + local[:-1, 1])
        & (remote[1:, 0] == remote[:-1, 0] + remote[:-1, 1])
        & (local[1:, 2] == local[:-1, 2])
        & (remote[1:, 2] == remote[:-1, 2])
    )
    starts = np.flatnonzero(np.concatenate(([True], ~follows)))
    lengths = np.add.reduceat(local[:, 1], starts)
    out = []
    for rows in (local, remote):
        merged = rows[starts].copy()
        merged[:, 1] = lengths
        out.append(merged)
    return out[0], out[1]
