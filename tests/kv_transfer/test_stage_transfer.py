"""Pipeline-parallel nodes over the TCP fallback (and the NIXL descriptors): an owner whose
ranks hold (layer range x head range) parts of the KV, a reader split otherwise, in one
process; each reader rank ends with exactly its layers and heads, each cell moved once."""

from __future__ import annotations

import ctypes
import dataclasses

import pytest
import torch

from engine.model.shard import Shard
from engine.model.stage import Stage
from kv_transfer import LayoutMismatch, LeaseTable, PeerInfo, nixl_available
from kv_transfer.head_plan import HeadSpan, LayerSpan, plan_kv
from kv_transfer.shards import KVShards, read_descriptors
from tests.kv_transfer.test_tcp_heads import agent, wait_released

BLOCKS, LAYERS, BS, HD, HEADS, KV_HEADS = 8, 5, 4, 8, 4, 2


def split(full: torch.Tensor, tp: int, pp: int) -> KVShards:
    """``full`` [blocks, layers, 2, bs, kv_heads, hd] as the ranks of a TP x PP engine hold it
    (rank r: tensor-parallel rank r % TP of stage r // TP)."""
    heads = [HeadSpan(*Shard(r % tp, tp).heads(HEADS, KV_HEADS)[1]) for r in range(tp * pp)]
    layers = [LayerSpan(*Stage.of(LAYERS, r // tp, pp).layers) for r in range(tp * pp)]
    tensors = [
        full[:, la.start : la.stop, :, :, h.start : h.stop].clone()
        for la, h in zip(layers, heads, strict=True)
    ]
    return KVShards(tensors, heads, KV_HEADS, layers)


NIXL = pytest.mark.skipif(not nixl_available(), reason="needs NIXL (nixl-cu12)")


@pytest.mark.parametrize("transport", ["tcp", pytest.param("nixl", marks=NIXL)])
@pytest.mark.parametrize(
    ("src", "dst"),
    [((1, 2), (1, 1)), ((1, 1), (1, 2)), ((2, 1), (1, 2)), ((1, 2), (2, 1)), ((2, 2), (1, 3)),
     ((1, 3), (2, 2)), ((2, 1), (1, 1)), ((1, 1), (2, 1))],
    ids=lambda s: f"tp{s[0]}pp{s[1]}",
)  # fmt: skip
async def test_each_reader_rank_gets_its_layers_and_heads_and_bytes_are_one_copy(
    src: tuple[int, int], dst: tuple[int, int], transport: str
) -> None:
    """Over TCP and real NIXL (UCX over CMA / shared memory on one host)."""
    full = torch.randn(BLOCKS, LAYERS, 2, BS, KV_HEADS, HD)
    freed: list[str] = []
    leases = LeaseTable(on_free=lambda rid, _ids: freed.append(rid))
    reader_shards = split(torch.zeros_like(full), *dst)
    owner = agent("owner", split(full, *src), leases, transport)
    reader = agent("reader", reader_shards, transport=transport)
    try:
        leases.grant("r1", [3, 5], 30.0)
        result = await reader.read_blocks(owner.info, [3, 5], [1, 6], request_id="r1")
        for t, (layers, heads) in zip(reader_shards.tensors, reader_shards.parts, strict=True):
            want = full[[3, 5], layers.start : layers.stop, :, :, heads.start : heads.stop]
            assert torch.equal(t[[1, 6]], want)
            assert not t[[b for b in range(BLOCKS) if b not in (1, 6)]].any()
        assert result.nbytes == 2 * full[0].numel() * full.element_size()
        await wait_released(owner, freed)
        assert freed == ["r1"]
    finally:
        owner.close()
        reader.close()


def test_peer_info_carries_each_ranks_layers_and_names_both_sizes() -> None:
    full = torch.zeros(BLOCKS, LAYERS, 2, BS, KV_HEADS, HD)
    node = agent("tp2pp2", split(full, 2, 2))
    try:
        again = PeerInfo.from_json(node.info.to_json())
        assert again == node.info and (again.tp_size, again.pp_size) == (2, 2)
        assert [s.layers for s in again.shards] == [LayerSpan(0, 2)] * 2 + [LayerSpan(2, 3)] * 2
    finally:
        node.close()


async def test_a_model_of_other_layers_is_refused_naming_both_sizes() -> None:
    full = torch.randn(BLOCKS, LAYERS, 2, BS, KV_HEADS, HD)
    owner, reader = agent("owner", split(full, 1, 2)), agent("reader", split(full, 2, 1))
    try:
        shards = list(owner.info.shards)
        shards[1] = dataclasses.replace(shards[1], num_layers=4)  # a model of 6 layers there
        broken = dataclasses.replace(owner.info, shards=tuple(shards))
        with pytest.raises(LayoutMismatch) as caught:
            await reader.read_blocks(broken, [0], [0], request_id="r")
        text = str(caught.value)
        assert "tensor_parallel_size=2 pipeline_parallel_size=1" in text
        assert "tensor_parallel_size=1 pipeline_parallel_size=2" in text
        assert "6 layers there, 5 here" in text
    finally:
        owner.close()
        reader.close()


@pytest.mark.parametrize(("src", "dst", "rows"), [((1, 2), (1, 1), 1), ((2, 2), (1, 3), None)])
def test_nixl_descriptors_address_exactly_the_pieces_cells(
    src: tuple[int, int], dst: tuple[int, int], rows: int | None
) -> None:
    """The rows a NIXL READ posts, read back through their addresses, are the sending
    rank's cells of the asked blocks and land on the receiving rank's; a piece of a rank's
    every head is one row per block (``rows``)."""
    full = torch.randn(BLOCKS, LAYERS, 2, BS, KV_HEADS, HD)
    theirs, mine = split(full, *src), split(torch.zeros_like(full), *dst)
    plan = plan_kv(theirs.parts, mine.parts, LAYERS, KV_HEADS)
    for piece in plan.reads:
        local, remote = read_descriptors(mine, theirs.rank_shards(), piece, [2, 7], [0, 5])
        assert len(local) == len(remote)
        if rows is not None:
            assert len(local) == 2 * rows
        for (la, ll, _), (ra, rl, _) in zip(local, remote, strict=True):
            assert ll == rl
            ctypes.memmove(int(la), int(ra), int(rl))
    for copy in plan.copies:
        mine.copy(copy, [0, 5])
    for t, (layers, heads) in zip(mine.tensors, mine.parts, strict=True):
        want = full[[2, 7], layers.start : layers.stop, :, :, heads.start : heads.stop]
        assert torch.equal(t[[0, 5]], want)
