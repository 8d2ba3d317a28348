"""Which KV heads move between which ranks when two nodes split the heads differently.

A node with tensor parallelism m holds the model's KV heads split over its m ranks: rank r
holds the global heads ``spans[r]`` (whole ranges; with fewer KV heads than ranks a head is
held by several ranks). Moving a request's KV to a node with n ranks means: every receiving
rank gets exactly the heads it holds, each head crosses the wire once (from the first sending
rank that holds it, into the first receiving rank that holds it), and a receiving rank that
replicates a head copies it from that first holder locally.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple


class HeadSpan(NamedTuple):
    """Global KV heads ``start .. start + length - 1``."""

    start: int
    length: int

    @property
    def stop(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class RankShard:
    """What a reader needs of one owner rank: its heads and where its blocks live."""

    start: int
    length: int
    base_address: int
    block_bytes: int
    device_id: int

    @property
    def heads(self) -> HeadSpan:
        return HeadSpan(self.start, self.length)


class Piece(NamedTuple):
    """Heads ``heads`` of sending rank ``src`` go to receiving rank ``dst``."""

    src: int
    dst: int
    heads: HeadSpan


class LocalCopy(NamedTuple):
    """After the reads, receiving rank ``dst`` copies ``heads`` from receiving rank ``src``
    (a replicated head, moved over the wire once)."""

    src: int
    dst: int
    heads: HeadSpan


class HeadPlan(NamedTuple):
    reads: tuple[Piece, ...]
    copies: tuple[LocalCopy, ...]

    def heads_moved(self) -> int:
        """KV heads that cross the wire (each head of the model once)."""
        return sum(p.heads.length for p in self.reads)

    def reads_into(self, dst: int) -> tuple[Piece, ...]:
        return tuple(p for p in self.reads if p.dst == dst)


def check_spans(spans: Sequence[HeadSpan], num_kv_heads: int, side: str) -> None:
    """ValueError unless ``spans`` are in-range, non-empty, and together hold every head."""
    held: set[int] = set()
    for rank, span in enumerate(spans):
        if span.length < 1 or span.start < 0 or span.stop > num_kv_heads:
            raise ValueError(
                f"{side} rank {rank} holds KV heads {span.start}..{span.stop - 1}, "
                f"outside the model's {num_kv_heads}"
            )
        held.update(range(span.start, span.stop))
    if len(held) != num_kv_heads:
        missing = sorted(set(range(num_kv_heads)) - held)
        raise ValueError(f"{side} ranks ({len(spans)}) hold no copy of KV heads {missing}")


def plan_heads(src: Sequence[HeadSpan], dst: Sequence[HeadSpan], num_kv_heads: int) -> HeadPlan:
    """The reads and local copies that give each ``dst`` rank its heads from ``src`` ranks.

    ValueError naming both tensor-parallel sizes when either side's spans cannot be mapped
    (a head no rank holds, a span outside the model)."""
    sizes = f"(sending tensor_parallel_size {len(src)}, receiving {len(dst)})"
    try:
        check_spans(src, num_kv_heads, "sending")
        check_spans(dst, num_kv_heads, "receiving")
    except ValueError as exc:
        raise ValueError(f"cannot map the KV heads {sizes}: {exc}") from None
    reads: list[tuple[int, int, int]] = []  # (src, dst, head), heads ascending
    copies: list[tuple[int, int, int]] = []
    for head in range(num_kv_heads):
        source = _first_holder(src, head)
        holders = [rank for rank, span in enumerate(dst) if span.start <= head < span.stop]
        reads.append((source, holders[0], head))
        copies.extend((holders[0], other, head) for other in holders[1:])
    return HeadPlan(
        tuple(Piece(*k) for k in _runs(reads)), tuple(LocalCopy(*k) for k in _runs(copies))
    )


def is_identity(plan: HeadPlan, src: Sequence[HeadSpan], dst: Sequence[HeadSpan]) -> bool:
    """Whether the plan is whole blocks of rank r into rank r (same split on both sides)."""
    return list(src) == list(dst) and not plan.copies


def _first_holder(spans: Sequence[HeadSpan], head: int) -> int:
    return next(rank for rank, span in enumerate(spans) if span.start <= head < span.stop)


def _runs(items: list[tuple[int, int, int]]) -> list[tuple[int, int, HeadSpan]]:
    """Consecutive heads with the same (src, dst) merged into one span."""
    out: list[tuple[int, int, HeadSpan]] = []
    for a, b, head in sorted(items):
        if out and out[-1][:2] == (a, b) and out[-1][2].stop == head:
            out[-1] = (a, b, HeadSpan(out[-1][2].start, out[-1][2].length + 1))
        else:
            out.append((a, b, HeadSpan(head, 1)))
    return out
