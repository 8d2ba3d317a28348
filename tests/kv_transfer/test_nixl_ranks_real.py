"""Real NIXL (UCX over CMA / shared memory on this host) between nodes of different tensor-
and pipeline-parallel sizes, two agents in one process: every receiving rank ends with
exactly its layers and heads, each cell moved once."""

from __future__ import annotations

import pytest
import torch

from kv_transfer import KVTransferAgent, LeaseTable, TransferConfig, nixl_available
from kv_transfer.shards import KVShards
from tests.kv_transfer.test_stage_transfer import BLOCKS, split
from tests.kv_transfer.test_tcp_heads import wait_released

pytestmark = pytest.mark.skipif(not nixl_available(), reason="needs NIXL (nixl-cu12)")


def agent(name: str, shards: KVShards, leases: LeaseTable | None = None) -> KVTransferAgent:
    return KVTransferAgent(
        shards.tensors[0],
        fingerprint="fp",
        layout=f"layout fp {name}",
        config=TransferConfig(name, transport="nixl", poll_interval_s=0.01),
        leases=leases,
        shards=shards if shards.size > 1 else None,
    )


@pytest.mark.parametrize(
    ("src", "dst"),
    [((2, 1), (1, 1)), ((1, 1), (2, 1)), ((1, 2), (1, 1)), ((2, 2), (1, 3))],
    ids=lambda s: f"tp{s[0]}pp{s[1]}",
)
async def test_real_nixl_moves_each_ranks_cells_once(
    src: tuple[int, int], dst: tuple[int, int]
) -> None:
    full = torch.randn(BLOCKS, 5, 2, 4, 2, 8)
    freed: list[str] = []
    leases = LeaseTable(on_free=lambda rid, _ids: freed.append(rid))
    reader_shards = split(torch.zeros_like(full), *dst)
    owner, reader = agent("owner", split(full, *src), leases), agent("reader", reader_shards)
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
