"""One process: argument checks, layout refusal on both sides, transport choice, lease loop."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
from collections.abc import Iterator

import pytest
import torch

from kv_transfer import (
    KVTransferAgent,
    LayoutMismatch,
    LeaseTable,
    TransferConfig,
    TransferError,
    TransferRefused,
    TransportKind,
    TransportUnavailable,
    nixl_available,
    nixl_loader,
)

SHAPE = (16, 2, 2, 4, 2, 8)  # [blocks, layers, 2, block_size, kv_heads, head_dim]


def tcp_agent(
    name: str, fingerprint: str = "fp", leases: LeaseTable | None = None, token: str | None = None
) -> KVTransferAgent:
    kv = torch.randn(SHAPE)
    config = TransferConfig(name, transport="tcp", poll_interval_s=0.01, token=token)
    return KVTransferAgent(
        kv, fingerprint=fingerprint, layout=f"layout {fingerprint}", config=config, leases=leases
    )


@pytest.fixture
def pair() -> Iterator[tuple[KVTransferAgent, KVTransferAgent]]:
    owner, reader = tcp_agent("owner"), tcp_agent("reader")
    yield owner, reader
    owner.close()
    reader.close()


async def test_reader_refuses_a_peer_with_another_layout(pair: tuple[KVTransferAgent, ...]) -> None:
    owner, reader = pair
    other = dataclasses.replace(owner.info, fingerprint="fp2", layout="layout fp2")
    with pytest.raises(LayoutMismatch) as caught:
        await reader.read_blocks(other, [0], [0], request_id="r")
    assert "layout fp2" in str(caught.value) and "layout fp]" in str(caught.value)


async def test_owner_refuses_a_reader_with_another_layout() -> None:
    owner, reader = tcp_agent("owner", "fpA"), tcp_agent("reader", "fpB")
    try:
        # A PeerInfo that claims the reader's layout: only the owner's handshake can tell.
        forged = dataclasses.replace(owner.info, fingerprint="fpB", layout="layout fpB")
        with pytest.raises(LayoutMismatch) as caught:
            await reader.read_blocks(forged, [0], [0], request_id="r")
        assert "layout fpA" in str(caught.value) and "layout fpB" in str(caught.value)
    finally:
        owner.close()
        reader.close()


@pytest.mark.parametrize(
    ("remote", "local", "problem"),
    [
        ([0, 1], [0], "has 2 ids but local_block_ids has 1"),
        ([], [], "remote_block_ids is empty"),
        ([16], [0], r"remote_block_ids must lie in \[0, 16\)"),
        ([0], [-1], "local_block_ids must lie"),
        ([0, 1], [3, 3], "local_block_ids holds the same block twice"),
    ],
)
async def test_bad_block_ids_are_value_errors(
    pair: tuple[KVTransferAgent, ...], remote: list[int], local: list[int], problem: str
) -> None:
    owner, reader = pair
    with pytest.raises(ValueError, match=problem):
        await reader.read_blocks(owner.info, remote, local, request_id="r")


async def test_a_peer_on_another_transport_is_refused(pair: tuple[KVTransferAgent, ...]) -> None:
    owner, reader = pair
    nixl_peer = dataclasses.replace(owner.info, transport=TransportKind.NIXL, nixl_metadata=b"x")
    with pytest.raises(TransferError, match="speaks nixl, this node tcp"):
        await reader.read_blocks(nixl_peer, [0], [0], request_id="r")


async def test_serve_ends_released_and_expired_leases() -> None:
    freed: list[str] = []
    leases = LeaseTable(lambda rid, blocks: freed.append(rid))
    owner, reader = tcp_agent("owner", leases=leases), tcp_agent("reader")
    serving = asyncio.create_task(owner.serve())
    try:
        leases.grant("read-me", [3, 4], ttl_s=60)
        leases.grant("forget-me", [5], ttl_s=0.05)
        await reader.read_blocks(owner.info, [3, 4], [0, 1], request_id="read-me")
        for _ in range(100):
            if len(freed) == 2:
                break
            await asyncio.sleep(0.01)
        assert sorted(freed) == ["forget-me", "read-me"]
        assert leases.held() == (0, 0)
        assert torch.equal(reader.region.kv[[0, 1]], owner.region.kv[[3, 4]])
        assert reader.counters.ok == 1 and reader.counters.bytes == 2 * reader.region.block_bytes
    finally:
        serving.cancel()
        owner.close()
        reader.close()


@pytest.mark.parametrize("reader_token", [None, "wrong-token"])
async def test_owner_refuses_a_reader_without_the_cluster_token(reader_token: str | None) -> None:
    owner = tcp_agent("owner", token="right-token")
    reader, good = tcp_agent("reader", token=reader_token), tcp_agent("good", token="right-token")
    try:
        with pytest.raises(TransferRefused, match="cluster token"):
            await reader.read_blocks(owner.info, [2], [0], request_id="r")
        assert not torch.equal(reader.region.kv[0], owner.region.kv[2])
        await good.read_blocks(owner.info, [2], [0], request_id="r")
        assert torch.equal(good.region.kv[0], owner.region.kv[2])
        assert "right-token" not in repr(owner.config) + repr(owner.identity)
    finally:
        for agent in (owner, reader, good):
            agent.close()


def test_auto_falls_back_to_tcp_without_nixl(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(nixl_loader, "_MODULES", ("no_such_nixl._api",))
    config = TransferConfig("n", transport="auto")
    with caplog.at_level(logging.INFO, logger="kv_transfer"):
        agent = KVTransferAgent(torch.zeros(SHAPE), fingerprint="f", layout="l", config=config)
    agent.close()
    assert agent.info.transport is TransportKind.TCP
    assert "falling back to TCP" in caplog.text and "transport tcp" in caplog.text
    with pytest.raises(TransportUnavailable, match="NIXL cannot be imported"):
        KVTransferAgent(
            torch.zeros(SHAPE), fingerprint="f", layout="l", config=TransferConfig("n", "nixl")
        )


@pytest.mark.skipif(not nixl_available(), reason="needs NIXL")
def test_auto_picks_nixl_and_logs_ucx_settings(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="kv_transfer"):
        agent = KVTransferAgent(
            torch.zeros(SHAPE), fingerprint="f", layout="l", config=TransferConfig("n")
        )
    agent.close()
    assert agent.info.transport is TransportKind.NIXL and agent.info.nixl_metadata
    assert "transport nixl (UCX backend, UCX_TLS" in caplog.text


@pytest.mark.skipif(not nixl_available(), reason="needs NIXL")
def test_close_destroys_both_nixl_agents() -> None:
    """close() drops the last references to the serving and the reading NIXL agent on the
    driver thread; one left to interpreter exit can abort the process ("terminate called
    without an active exception")."""
    config = TransferConfig("closing", transport="nixl")
    agent = KVTransferAgent(torch.zeros(SHAPE), fingerprint="f", layout="l", config=config)
    name = agent.identity.agent_name
    assert agent.transport.inflight() == 0  # the reading agent has started by now
    agent.close()
    gc.collect()
    alive = [o for o in gc.get_objects() if type(o).__name__ == "nixl_agent"]
    assert [o.name for o in alive if o.name.startswith(name)] == []


async def test_a_release_without_a_read_ends_the_lease() -> None:
    freed: list[str] = []
    leases = LeaseTable(lambda rid, blocks: freed.append(rid))
    owner, reader = tcp_agent("owner", leases=leases), tcp_agent("reader")
    serving = asyncio.create_task(owner.serve())
    try:
        leases.grant("cached-here", [3, 4], ttl_s=60)
        before = reader.region.kv.clone()
        await reader.release(owner.info, "cached-here")
        for _ in range(500):
            if freed:
                break
            await asyncio.sleep(0.01)
        assert freed == ["cached-here"] and leases.held() == (0, 0)
        assert torch.equal(reader.region.kv, before)  # nothing was written
        assert reader.counters.bytes == 0
    finally:
        serving.cancel()
        owner.close()
        reader.close()
