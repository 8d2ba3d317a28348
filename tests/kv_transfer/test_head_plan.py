"""Head-range mapping between nodes that split the KV heads over different numbers of ranks."""

from __future__ import annotations

import pytest

from engine.model.shard import Shard
from kv_transfer.head_plan import HeadPlan, HeadSpan, LocalCopy, Piece, plan_heads


def spans(size: int, heads: int = 4, kv_heads: int = 2) -> list[HeadSpan]:
    """The KV heads each rank of an engine of ``size`` ranks holds (engine.model.shard)."""
    return [HeadSpan(*Shard(r, size).heads(heads, kv_heads)[1]) for r in range(size)]


def received(plan: HeadPlan, dst: list[HeadSpan]) -> list[list[int]]:
    """The heads each receiving rank ends with, in order, from reads and local copies."""
    got: list[list[int]] = [[] for _ in dst]
    for piece in plan.reads:
        got[piece.dst] += range(piece.heads.start, piece.heads.stop)
    for copy in plan.copies:
        assert all(h in got[copy.src] for h in range(copy.heads.start, copy.heads.stop))
        got[copy.dst] += range(copy.heads.start, copy.heads.stop)
    return [sorted(g) for g in got]


@pytest.mark.parametrize(
    ("m", "n", "heads", "kv_heads"),
    [(1, 2, 4, 2), (2, 1, 4, 2), (2, 4, 8, 4), (4, 2, 8, 4), (3, 2, 6, 3), (2, 3, 6, 3)],
)
def test_each_receiving_rank_gets_exactly_its_heads_each_moved_once(
    m: int, n: int, heads: int, kv_heads: int
) -> None:
    src, dst = spans(m, heads, kv_heads), spans(n, heads, kv_heads)
    plan = plan_heads(src, dst, kv_heads)
    assert received(plan, dst) == [list(range(s.start, s.stop)) for s in dst]
    assert plan.heads_moved() == kv_heads
    for piece in plan.reads:  # a sender sends only heads it holds
        s = src[piece.src]
        assert s.start <= piece.heads.start and piece.heads.stop <= s.stop


def test_uneven_three_to_two_splits_the_middle_head_group() -> None:
    # 3 KV heads over 3 senders (one each), 2 receivers (1 and 2 heads: uneven)
    src, dst = spans(3, 6, 3), spans(2, 6, 3)
    assert dst == [HeadSpan(0, 1), HeadSpan(1, 2)]
    assert plan_heads(src, dst, 3) == HeadPlan(
        (Piece(0, 0, HeadSpan(0, 1)), Piece(1, 1, HeadSpan(1, 1)), Piece(2, 1, HeadSpan(2, 1))),
        (),
    )


def test_replicated_heads_cross_the_wire_once_and_are_copied_locally() -> None:
    # 2 KV heads over 4 receivers: ranks 0, 1 hold head 0; ranks 2, 3 hold head 1
    plan = plan_heads(spans(1), spans(4), 2)
    assert plan.reads == (Piece(0, 0, HeadSpan(0, 1)), Piece(0, 2, HeadSpan(1, 1)))
    assert plan.copies == (LocalCopy(0, 1, HeadSpan(0, 1)), LocalCopy(2, 3, HeadSpan(1, 1)))


def test_replicated_senders_send_each_head_from_one_rank() -> None:
    plan = plan_heads(spans(4), spans(1), 2)
    assert plan.reads == (Piece(0, 0, HeadSpan(0, 1)), Piece(2, 0, HeadSpan(1, 1)))
    assert plan.heads_moved() == 2


@pytest.mark.parametrize(
    ("src", "dst", "problem"),
    [
        ([HeadSpan(0, 1)], [HeadSpan(0, 2)], r"sending ranks \(1\) hold no copy of KV heads \[1\]"),
        ([HeadSpan(0, 2)], [HeadSpan(0, 3)], "receiving rank 0 holds KV heads 0..2, outside"),
    ],
)
def test_unmappable_spans_name_both_sizes(
    src: list[HeadSpan], dst: list[HeadSpan], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem) as caught:
        plan_heads(src, dst, 2)
    assert f"sending tensor_parallel_size {len(src)}, receiving {len(dst)}" in str(caught.value)
