"""Mixed tensor parallelism over the TCP fallback: an owner of m ranks, a reader of n ranks,
in one process; each reader rank ends with exactly its heads, each head moved once."""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import time

import pytest
import torch

from engine.model.shard import Shard
from kv_transfer import KVTransferAgent, LayoutMismatch, LeaseTable, PeerInfo, TransferConfig
from kv_transfer.head_plan import HeadSpan, plan_heads
from kv_transfer.shards import KVShards, read_descriptors

BLOCKS, LAYERS, BS, HD = 8, 2, 4, 8


def split(full: torch.Tensor, size: int, heads: int) -> KVShards:
    kv_heads = full.shape[4]
    spans = [HeadSpan(*Shard(r, size).heads(heads, kv_heads)[1]) for r in range(size)]
    tensors = [full[:, :, :, :, s.start : s.stop].clone() for s in spans]
    return KVShards(tensors, spans, kv_heads)


def agent(
    name: str, shards: KVShards, leases: LeaseTable | None = None, transport: str = "tcp"
) -> KVTransferAgent:
    """A node's transfer agent over `shards` (rank 0's tensor first), fingerprint "fp"."""
    return KVTransferAgent(
        shards.tensors[0],
        fingerprint="fp",
        layout="layout fp",
        config=TransferConfig(name, transport=transport, poll_interval_s=0.01),
        leases=leases,
        shards=shards if shards.size > 1 else None,
    )


@pytest.mark.parametrize(
    ("m", "n", "heads", "kv_heads"),
    [(1, 2, 4, 2), (2, 1, 4, 2), (2, 4, 8, 4), (4, 2, 8, 4), (3, 2, 6, 3), (1, 4, 4, 2)],
)
async def test_each_reader_rank_gets_its_heads_and_bytes_are_one_copy(
    m: int, n: int, heads: int, kv_heads: int
) -> None:
    full = torch.randn(BLOCKS, LAYERS, 2, BS, kv_heads, HD)
    freed: list[str] = []
    leases = LeaseTable(on_free=lambda rid, _ids: freed.append(rid))
    owner_shards = split(full, m, heads)
    reader_shards = split(torch.zeros_like(full), n, heads)
    owner, reader = agent("owner", owner_shards, leases), agent("reader", reader_shards)
    try:
        leases.grant("r1", [3, 5], 30.0)
        result = await reader.read_blocks(owner.info, [3, 5], [1, 6], request_id="r1")
        for t, span in zip(reader_shards.tensors, reader_shards.spans, strict=True):
            want = full[[3, 5]][:, :, :, :, span.start : span.stop]
            assert torch.equal(t[[1, 6]], want)
            untouched = [b for b in range(BLOCKS) if b not in (1, 6)]
            assert not t[untouched].any()
        assert result.nbytes == 2 * full[0].numel() * full.element_size()
        await wait_released(owner, freed)  # the READ's release notice ends the lease
        assert freed == ["r1"]
    finally:
        owner.close()
        reader.close()


def test_peer_info_carries_the_ranks_only_when_there_are_several() -> None:
    full = torch.zeros(BLOCKS, LAYERS, 2, BS, 2, HD)
    two, one = agent("two", split(full, 2, 4)), agent("one", split(full, 1, 4))
    try:
        again = PeerInfo.from_json(two.info.to_json())
        assert again == two.info and again.tp_size == 2 and again.num_kv_heads == 2
        assert [s.heads for s in again.shards] == [HeadSpan(0, 1), HeadSpan(1, 1)]
        assert "shards" not in one.info.to_json()  # as published before ranks existed
        assert PeerInfo.from_json(one.info.to_json()) == one.info
    finally:
        two.close()
        one.close()


async def test_heads_that_cannot_be_mapped_are_refused_naming_both_sizes() -> None:
    full = torch.randn(BLOCKS, LAYERS, 2, BS, 2, HD)
    owner_shards, reader_shards = split(full, 2, 4), split(torch.zeros_like(full), 1, 4)
    owner, reader = agent("owner", owner_shards), agent("reader", reader_shards)
    try:
        broken = dataclasses.replace(owner.info, num_kv_heads=3)  # a model of 3 KV heads
        with pytest.raises(LayoutMismatch) as caught:
            await reader.read_blocks(broken, [0], [0], request_id="r")
        text = str(caught.value)
        assert "tensor_parallel_size=1" in text and "tensor_parallel_size=2" in text
        assert "3 KV heads there, 2 here" in text
    finally:
        owner.close()
        reader.close()


def test_nixl_descriptors_address_exactly_the_pieces_heads() -> None:
    """The rows a head-range NIXL READ posts: read back through their addresses, they are
    the sending rank's heads of the asked blocks, and land on the receiving rank's."""
    full = torch.randn(BLOCKS, LAYERS, 2, BS, 4, HD)
    src, dst = split(full, 4, 8), split(torch.zeros_like(full), 2, 8)
    plan = plan_heads(src.spans, dst.spans, 4, LAYERS)
    for piece in plan.reads:
        local, remote = read_descriptors(dst, src.rank_shards(), piece, [2, 7], [0, 5])
        assert len(local) == len(remote) == 2 * LAYERS * 2 * BS
        for (la, ll, _), (ra, rl, _) in zip(local, remote, strict=True):
            assert ll == rl
            ctypes.memmove(int(la), int(ra), int(rl))
    for t, span in zip(dst.tensors, dst.spans, strict=True):
        assert torch.equal(t[[0, 5]], full[[2, 7]][:, :, :, :, span.start : span.stop])


async def wait_released(owner: KVTransferAgent, freed: list[str]) -> None:
    """Drain the owner's release notices until one ended a lease (10 s deadline)."""
    give_up = time.monotonic() + 10.0
    while not freed:
        assert time.monotonic() < give_up, "the READ's release notice never arrived"
        owner.poll()
        await asyncio.sleep(0.01)
