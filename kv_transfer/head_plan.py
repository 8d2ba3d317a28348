"""Which parts of the KV (layers x heads) move between which ranks when two nodes split the
cache differently.

A node of ``TP x PP`` ranks holds the model's KV split in two ways: pipeline stage ``s``
holds a contiguous range of layers, and tensor-parallel rank ``t`` of a stage holds a range
of KV heads (whole ranges; with fewer KV heads than ranks a head is held by several ranks).
Each rank is described by a ``RankKV``: the layers and heads it holds. Moving a request's KV
to a node split otherwise means: every receiving rank gets exactly the (layer, head) cells it
holds, each cell crosses the wire once (from the first sending rank that holds it, into the
first receiving rank that holds it), and a receiving rank that replicates a head copies it
from that first holder locally. Neighbouring cells with the same two ranks travel as one
piece (a rectangle of layers x heads).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple


class HeadSpan(NamedTuple):
    """Global indices ``start .. start + length - 1`` (of KV heads, or of layers)."""

    start: int
    length: int

    @property
    def stop(self) -> int:
        return self.start + self.length


LayerSpan = HeadSpan  # the same range type, over the model's layers


class RankKV(NamedTuple):
    """The model's layers and KV heads one rank holds."""

    layers: LayerSpan
    heads: HeadSpan


@dataclass(frozen=True)
class RankShard:
    """What a reader needs of one owner rank: its heads and layers, and where its blocks live
    (``layer_start``, ``num_layers``: the pipeline stage's layers). ``tcp_host`` /
    ``tcp_port``: the rank's own TCP listener, which serves its cells from its own process
    (port 0: the node's block server serves them). ``nixl_metadata``: the rank's own NIXL
    agent, which registers its tensor in its own process at ``agent_base_address`` (its
    address there; ``base_address`` is where rank 0's process maps it), or None: the node's
    agent, rank 0's, serves the rank's cells."""

    start: int
    length: int
    base_address: int
    block_bytes: int
    device_id: int
    layer_start: int
    num_layers: int
    tcp_host: str = ""
    tcp_port: int = 0
    nixl_metadata: bytes | None = field(default=None, repr=False)
    agent_base_address: int = 0

    @property
    def heads(self) -> HeadSpan:
        return HeadSpan(self.start, self.length)

    @property
    def layers(self) -> LayerSpan:
        return LayerSpan(self.layer_start, self.num_layers)

    @property
    def part(self) -> RankKV:
        return RankKV(self.layers, self.heads)


class Piece(NamedTuple):
    """Layers ``layers`` x heads ``heads`` of sending rank ``src`` go to receiving rank
    ``dst``."""

    src: int
    dst: int
    heads: HeadSpan
    layers: LayerSpan


class LocalCopy(NamedTuple):
    """After the reads, receiving rank ``dst`` copies ``layers`` x ``heads`` from receiving
    rank ``src`` (a replicated head, moved over the wire once)."""

    src: int
    dst: int
    heads: HeadSpan
    layers: LayerSpan


class HeadPlan(NamedTuple):
    reads: tuple[Piece, ...]
    copies: tuple[LocalCopy, ...]

    def cells_moved(self) -> int:
        """(layer, KV head) cells that cross the wire (each of the model's once)."""
        return sum(p.heads.length * p.layers.length for p in self.reads)

    def reads_into(self, dst: int) -> tuple[Piece, ...]:
        return tuple(p for p in self.reads if p.dst == dst)


def parallel_sizes(parts: Sequence[RankKV]) -> tuple[int, int]:
    """(tensor_parallel_size, pipeline_parallel_size) of a node whose ranks hold ``parts``:
    the stages are the distinct layer ranges."""
    stages = len({p.layers for p in parts}) or 1
    return max(len(parts) // stages, 1), stages


def sizes_text(parts: Sequence[RankKV]) -> str:
    tp, pp = parallel_sizes(parts)
    return f"tensor_parallel_size={tp} pipeline_parallel_size={pp}"


def check_parts(parts: Sequence[RankKV], num_layers: int, num_kv_heads: int, side: str) -> None:
    """ValueError unless every rank's part is in range and non-empty, and together the
    parts hold every (layer, head) of the model."""
    for rank, (layers, heads) in enumerate(parts):
        if heads.length < 1 or heads.start < 0 or heads.stop > num_kv_heads:
            raise ValueError(
                f"{side} rank {rank} holds KV heads {heads.start}..{heads.stop - 1}, "
                f"outside the model's {num_kv_heads}"
            )
        if layers.length < 1 or layers.start < 0 or layers.stop > num_layers:
            raise ValueError(
                f"{side} rank {rank} holds layers {layers.start}..{layers.stop - 1}, "
                f"outside the model's {num_layers}"
            )
    for layer in range(num_layers):
        held: set[int] = set()
        for layers, heads in parts:
            if layers.start <= layer < layers.stop:
                held.update(range(heads.start, heads.stop))
        if len(held) != num_kv_heads:
            missing = sorted(set(range(num_kv_heads)) - held)
            raise ValueError(
                f"{side} ranks ({len(parts)}) hold no copy of layer {layer}'s KV heads {missing}"
            )


def plan_kv(
    src: Sequence[RankKV], dst: Sequence[RankKV], num_layers: int, num_kv_heads: int
) -> HeadPlan:
    """The reads and local copies that give each ``dst`` rank its layers and heads from the
    ``src`` ranks.

    ValueError naming both sides' tensor- and pipeline-parallel sizes when either side's
    parts cannot be mapped (a cell no rank holds, a range outside the model)."""
    sizes = f"(sending {sizes_text(src)}, receiving {sizes_text(dst)})"
    try:
        check_parts(src, num_layers, num_kv_heads, "sending")
        check_parts(dst, num_layers, num_kv_heads, "receiving")
    except ValueError as exc:
        raise ValueError(f"cannot map the KV {sizes}: {exc}") from None
    reads: list[tuple[int, int, LayerSpan, int]] = []  # (src, dst, layers, head)
    copies: list[tuple[int, int, LayerSpan, int]] = []
    for seg in _segments([*src, *dst], num_layers):
        for head in range(num_kv_heads):
            source = _holders(src, seg, head)[0]
            holders = _holders(dst, seg, head)
            reads.append((source, holders[0], seg, head))
            copies.extend((holders[0], other, seg, head) for other in holders[1:])
    return HeadPlan(
        tuple(Piece(a, b, h, layer) for a, b, h, layer in _merge(reads)),
        tuple(LocalCopy(a, b, h, layer) for a, b, h, layer in _merge(copies)),
    )


def plan_heads(
    src: Sequence[HeadSpan], dst: Sequence[HeadSpan], num_kv_heads: int, num_layers: int
) -> HeadPlan:
    """``plan_kv`` between two nodes of one stage each (every rank holds every layer)."""
    every = LayerSpan(0, num_layers)
    return plan_kv(
        [RankKV(every, s) for s in src], [RankKV(every, s) for s in dst], num_layers, num_kv_heads
    )


def is_identity(plan: HeadPlan, src: Sequence[RankKV], dst: Sequence[RankKV]) -> bool:
    """Whether the plan is whole blocks of rank r into rank r (same split on both sides)."""
    return list(src) == list(dst) and not plan.copies


def _segments(parts: Sequence[RankKV], num_layers: int) -> list[LayerSpan]:
    """The layer ranges between every boundary of any part (no part starts or stops inside
    one)."""
    cuts = sorted(
        {0, num_layers, *(p.layers.start for p in parts), *(p.layers.stop for p in parts)}
    )
    return [LayerSpan(a, b - a) for a, b in itertools.pairwise(cuts) if b > a]


def _holders(parts: Sequence[RankKV], seg: LayerSpan, head: int) -> list[int]:
    return [
        rank
        for rank, (layers, heads) in enumerate(parts)
        if layers.start <= seg.start
        and seg.stop <= layers.stop
        and heads.start <= head < heads.stop
    ]


def _merge(
    cells: list[tuple[int, int, LayerSpan, int]],
) -> list[tuple[int, int, HeadSpan, LayerSpan]]:
    """Consecutive heads with the same ranks and layers merged into one head range, then
    neighbouring layer ranges with the same ranks and heads merged into one."""
    runs: list[tuple[int, int, LayerSpan, HeadSpan]] = []
    for a, b, seg, head in sorted(cells):
        last = runs[-1] if runs else None
        if last is not None and last[:3] == (a, b, seg) and last[3].stop == head:
            runs[-1] = (a, b, seg, HeadSpan(last[3].start, last[3].length + 1))
        else:
            runs.append((a, b, seg, HeadSpan(head, 1)))
    out: list[tuple[int, int, HeadSpan, LayerSpan]] = []
    for a, b, seg, heads in sorted(runs, key=lambda r: (r[0], r[1], r[3], r[2])):
        last2 = out[-1] if out else None
        if last2 is not None and last2[:3] == (a, b, heads) and last2[3].stop == seg.start:
            out[-1] = (a, b, heads, LayerSpan(last2[3].start, last2[3].length + seg.length))
        else:
            out.append((a, b, heads, seg))
    return sorted(out, key=lambda r: (r[0], r[1], r[3], r[2]))
