"""Layer- and head-range mapping between nodes that split the KV over different numbers of
tensor-parallel ranks (heads) and pipeline stages (layers)."""

from __future__ import annotations

import pytest

from engine.model.shard import Shard
from engine.model.stage import Stage
from kv_transfer.head_plan import (
    HeadPlan,
    HeadSpan,
    LayerSpan,
    LocalCopy,
    Piece,
    RankKV,
    plan_heads,
    plan_kv,
)

ALL = LayerSpan(0, 1)  # plan_heads: one stage of one layer


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
    plan = plan_heads(src, dst, kv_heads, 1)
    assert received(plan, dst) == [list(range(s.start, s.stop)) for s in dst]
    assert plan.cells_moved() == kv_heads
    for piece in plan.reads:  # a sender sends only heads it holds
        s = src[piece.src]
        assert s.start <= piece.heads.start and piece.heads.stop <= s.stop


def test_uneven_three_to_two_splits_the_middle_head_group() -> None:
    # 3 KV heads over 3 senders (one each), 2 receivers (1 and 2 heads: uneven)
    src, dst = spans(3, 6, 3), spans(2, 6, 3)
    assert dst == [HeadSpan(0, 1), HeadSpan(1, 2)]
    assert plan_heads(src, dst, 3, 1) == HeadPlan(
        (
            Piece(0, 0, HeadSpan(0, 1), ALL),
            Piece(1, 1, HeadSpan(1, 1), ALL),
            Piece(2, 1, HeadSpan(2, 1), ALL),
        ),
        (),
    )


def test_replicated_heads_cross_the_wire_once_and_are_copied_locally() -> None:
    # 2 KV heads over 4 receivers: ranks 0, 1 hold head 0; ranks 2, 3 hold head 1
    plan = plan_heads(spans(1), spans(4), 2, 1)
    assert plan.reads == (Piece(0, 0, HeadSpan(0, 1), ALL), Piece(0, 2, HeadSpan(1, 1), ALL))
    assert plan.copies == (
        LocalCopy(0, 1, HeadSpan(0, 1), ALL),
        LocalCopy(2, 3, HeadSpan(1, 1), ALL),
    )


def test_replicated_senders_send_each_head_from_one_rank() -> None:
    plan = plan_heads(spans(4), spans(1), 2, 1)
    assert plan.reads == (Piece(0, 0, HeadSpan(0, 1), ALL), Piece(2, 0, HeadSpan(1, 1), ALL))
    assert plan.cells_moved() == 2


@pytest.mark.parametrize(
    ("src", "dst", "problem"),
    [
        (
            [HeadSpan(0, 1)],
            [HeadSpan(0, 2)],
            r"sending ranks \(1\) hold no copy of layer 0's KV heads \[1\]",
        ),
        ([HeadSpan(0, 2)], [HeadSpan(0, 3)], "receiving rank 0 holds KV heads 0..2, outside"),
    ],
)
def test_unmappable_spans_name_both_sizes(
    src: list[HeadSpan], dst: list[HeadSpan], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem) as caught:
        plan_heads(src, dst, 2, 1)
    sizes = (
        f"sending tensor_parallel_size={len(src)} pipeline_parallel_size=1, "
        f"receiving tensor_parallel_size={len(dst)} pipeline_parallel_size=1"
    )
    assert sizes in str(caught.value)


def parts(tp: int, pp: int, layers: int = 5, heads: int = 4, kv_heads: int = 2) -> list[RankKV]:
    """What each rank of an engine of TP x PP ranks holds (rank r: TP rank r % TP of stage
    r // TP, as engine.parallel numbers them)."""
    return [
        RankKV(
            LayerSpan(*Stage.of(layers, r // tp, pp).layers),
            HeadSpan(*Shard(r % tp, tp).heads(heads, kv_heads)[1]),
        )
        for r in range(tp * pp)
    ]


def cells(plan: HeadPlan, dst: list[RankKV]) -> list[set[tuple[int, int]]]:
    """The (layer, head) cells each receiving rank ends with; a cell read twice fails."""
    got: list[set[tuple[int, int]]] = [set() for _ in dst]
    moved = [(p.dst, p.layers, p.heads) for p in plan.reads]
    local = [(c.dst, c.layers, c.heads) for c in plan.copies]
    for dst_rank, layers, heads in moved + local:
        new = {
            (la, h)
            for la in range(layers.start, layers.stop)
            for h in range(heads.start, heads.stop)
        }
        assert not new & got[dst_rank], "a cell arrives twice"
        got[dst_rank] |= new
    return got


@pytest.mark.parametrize(
    ("src", "dst"),
    [((1, 2), (1, 1)), ((1, 1), (1, 2)), ((2, 1), (1, 2)), ((1, 2), (2, 1)), ((2, 2), (1, 3)),
     ((1, 3), (2, 2)), ((4, 2), (1, 1)), ((1, 5), (4, 1))],
    ids=lambda s: f"tp{s[0]}pp{s[1]}",
)  # fmt: skip
def test_pipeline_stages_each_get_their_layers_every_cell_moved_once(
    src: tuple[int, int], dst: tuple[int, int]
) -> None:
    theirs, mine = parts(*src), parts(*dst)
    plan = plan_kv(theirs, mine, 5, 2)
    want = [
        {
            (la, h)
            for la in range(p.layers.start, p.layers.stop)
            for h in range(p.heads.start, p.heads.stop)
        }
        for p in mine
    ]
    assert cells(plan, mine) == want
    assert plan.cells_moved() == 5 * 2  # each layer's each head crosses the wire once
    for piece in plan.reads:  # a sender sends only cells it holds
        layers, heads = theirs[piece.src]
        assert layers.start <= piece.layers.start and piece.layers.stop <= layers.stop
        assert heads.start <= piece.heads.start and piece.heads.stop <= heads.stop


def test_two_stages_into_one_rank_are_two_whole_stage_pieces() -> None:
    plan = plan_kv(parts(1, 2), parts(1, 1), 5, 2)
    assert plan == HeadPlan(
        (
            Piece(0, 0, HeadSpan(0, 2), LayerSpan(0, 2)),
            Piece(1, 0, HeadSpan(0, 2), LayerSpan(2, 3)),
        ),
        (),
    )


def test_one_rank_into_tp2_x_pp2_splits_both_ways() -> None:
    plan = plan_kv(parts(1, 1), parts(2, 2), 5, 2)
    assert plan.reads == (
        Piece(0, 0, HeadSpan(0, 1), LayerSpan(0, 2)),
        Piece(0, 1, HeadSpan(1, 1), LayerSpan(0, 2)),
        Piece(0, 2, HeadSpan(0, 1), LayerSpan(2, 3)),
        Piece(0, 3, HeadSpan(1, 1), LayerSpan(2, 3)),
    )


def test_uneven_stage_boundaries_cut_the_pieces() -> None:
    # 5 layers: 2 stages hold 0-1 and 2-4; 3 stages hold 0, 1-2 and 3-4
    plan = plan_kv(parts(1, 2), parts(1, 3), 5, 2)
    every = HeadSpan(0, 2)
    assert plan.reads == (
        Piece(0, 0, every, LayerSpan(0, 1)),
        Piece(0, 1, every, LayerSpan(1, 1)),
        Piece(1, 1, every, LayerSpan(2, 1)),
        Piece(1, 2, every, LayerSpan(3, 2)),
    )


def test_layers_no_rank_holds_are_refused_naming_both_sizes() -> None:
    half = [RankKV(LayerSpan(0, 2), HeadSpan(0, 2))]  # a sender of 2 of the 5 layers
    with pytest.raises(ValueError) as caught:
        plan_kv(half, parts(1, 2), 5, 2)
    text = str(caught.value)
    assert "sending ranks (1) hold no copy of layer 2's KV heads [0, 1]" in text
    assert "tensor_parallel_size=1 pipeline_parallel_size=1" in text
    assert "receiving tensor_parallel_size=1 pipeline_parallel_size=2" in text
    with pytest.raises(ValueError, match=r"holds layers 3\.\.5, outside the model's 5"):
        plan_kv(parts(1, 1), [RankKV(LayerSpan(3, 3), HeadSpan(0, 2))], 5, 2)
