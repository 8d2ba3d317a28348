"""Real NIXL with each sending rank's own agent (kv_transfer.rank_agent): a reader pulls
every rank's cells from the agent that rank registered them with, one transfer per agent,
all at once; each receiving rank ends with exactly its heads, one copy of the bytes; a
sending rank whose process is killed fails the next READ naming it, within its deadline."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import pytest
import torch

from kv_transfer import KVTransferAgent, LeaseTable, PeerInfo, PeerUnavailable, nixl_available
from kv_transfer.rank_agent import RankAgent, close_rank_agents, serve_rank_nixl
from kv_transfer.shards import KVShards
from tests.kv_transfer.test_rank_transfer import RankProcess
from tests.kv_transfer.test_tcp_heads import BLOCKS, split, wait_released
from tests.kv_transfer.test_tcp_heads import agent as tcp_heads_agent

pytestmark = pytest.mark.skipif(not nixl_available(), reason="needs NIXL (nixl-cu12)")


def agent(name: str, shards: KVShards, leases: LeaseTable | None = None) -> KVTransferAgent:
    return tcp_heads_agent(name, shards, leases, "nixl")


@pytest.fixture(autouse=True)
def rank_agents() -> Iterator[None]:
    yield
    close_rank_agents()


def serve_ranks(owner: KVTransferAgent, served: list[torch.Tensor]) -> None:
    """Ranks 1.. serve ``served`` (not the tensors the node's agent registered) with agents
    of their own."""
    setups = owner.rank_agents()
    assert len(setups) == len(served)
    ranks = enumerate(zip(served, setups, strict=True), start=1)
    if served:
        owner.use_rank_agents([serve_rank_nixl(t, r, s) for r, (t, s) in ranks])


@pytest.mark.parametrize(
    ("m", "n"), [(2, 1), (1, 2), (2, 2)], ids=["tp2-tp1", "tp1-tp2", "tp2-tp2"]
)
async def test_each_sending_rank_is_read_from_its_own_agent(m: int, n: int) -> None:
    full = torch.randn(BLOCKS, 2, 2, 4, 2, 8)
    freed: list[str] = []
    leases = LeaseTable(on_free=lambda rid, _ids: freed.append(rid))
    real = split(full, m, 4)
    # The node's agent holds zeros for ranks 1..: the cells only arrive from the ranks' agents.
    blank = [real.tensors[0], *(torch.zeros_like(t) for t in real.tensors[1:])]
    owner_shards = KVShards(blank, real.spans, real.num_kv_heads)
    reader_shards = split(torch.zeros_like(full), n, 4)
    owner, reader = agent("owner", owner_shards, leases), agent("reader", reader_shards)
    try:
        serve_ranks(owner, real.tensors[1:])
        info = PeerInfo.from_json(owner.info.to_json())
        assert info == owner.info
        own = [s.nixl_metadata is not None for s in info.shards]
        assert own == ([False] + [True] * (m - 1) if m > 1 else [])
        leases.grant("r1", [3, 5], 30.0)
        result = await reader.read_blocks(info, [3, 5], [1, 6], request_id="r1")
        for t, span in zip(reader_shards.tensors, reader_shards.spans, strict=True):
            assert torch.equal(t[[1, 6]], full[[3, 5]][:, :, :, :, span.start : span.stop])
            assert not t[[b for b in range(BLOCKS) if b not in (1, 6)]].any()
        assert result.nbytes == 2 * full[0].numel() * full.element_size()  # one copy
        await wait_released(owner, freed)  # the release still goes to rank 0's agent
        assert freed == ["r1"]
    finally:
        owner.close()
        reader.close()


async def test_a_killed_sending_rank_fails_the_read_naming_it_within_the_deadline() -> None:
    shape = (BLOCKS, 2, 2, 4, 1, 8)
    owner_shards = split(torch.zeros(*shape[:4], 2, shape[5]), 2, 4)
    reader_shards = split(torch.zeros(*shape[:4], 2, shape[5]), 1, 4)
    owner, reader = agent("owner", owner_shards), agent("reader", reader_shards)
    (setup,) = owner.rank_agents()
    rank = RankProcess({"seed": 3, "shape": list(shape), "rank": 1, "nixl": vars(setup)})
    try:
        metadata = base64.b64decode(rank.hello["nixl_metadata"])
        owner.use_rank_agents([RankAgent(metadata, rank.hello["address"])])
        ids = list(range(BLOCKS))
        await reader.read_blocks(owner.info, ids, ids, request_id="warm")
        expected = torch.randn(shape, generator=torch.Generator().manual_seed(3))
        assert torch.equal(reader_shards.tensors[0][:, :, :, :, 1:], expected)  # from its process
        rank.proc.kill()
        rank.proc.wait(30.0)
        start = time.monotonic()
        with pytest.raises(PeerUnavailable, match="sending rank 1") as caught:
            await reader.read_blocks(owner.info, ids, ids, request_id="r", deadline_s=3.0)
        assert time.monotonic() - start < 3.0, caught.value
    finally:
        rank.close()
        owner.close()
        reader.close()
