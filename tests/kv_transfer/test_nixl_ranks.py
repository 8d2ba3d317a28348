"""NIXL between nodes of different tensor- and pipeline-parallel sizes, at the descriptor
level (NIXL itself is replaced by an in-process fake that copies each descriptor row): one
READ posts every piece of every (sending rank, receiving rank) pair at once, so all ranks'
cells move in one transfer request; each receiving rank ends with its cells, one copy."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
import torch

from kv_transfer import KVTransferAgent, LeaseTable, nixl_transport
from tests.kv_transfer.test_stage_transfer import BLOCKS, split
from tests.kv_transfer.test_tcp_heads import agent as tcp_heads_agent
from tests.kv_transfer.test_tcp_heads import wait_released

AGENTS: dict[str, FakeAgent] = {}


class _Releasable:
    def release(self) -> None:
        pass


class FakeAgent:
    """The calls NixlTransport makes of a nixl_agent; a READ is a memmove per row."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.notifs: dict[str, list[bytes]] = {}
        self.posted: list[tuple[np.ndarray, np.ndarray]] = []
        AGENTS[name] = self

    def register_memory(self, tensor: torch.Tensor) -> None:
        pass

    def get_agent_metadata(self) -> bytes:
        return self.name.encode()

    def prep_xfer_dlist(self, *_args: Any) -> _Releasable:
        return _Releasable()

    def add_remote_agent(self, metadata: bytes) -> bytes:
        return metadata

    def remove_remote_agent(self, name: str) -> None:
        pass

    def get_xfer_descs(self, rows: np.ndarray, _mem_type: str) -> np.ndarray:
        return rows

    def initialize_xfer(self, op: str, local: np.ndarray, remote: np.ndarray, *_: Any) -> Any:
        assert op == "READ"
        self.posted.append((local, remote))
        return _Releasable()

    def transfer(self, _handle: Any) -> str:
        local, remote = self.posted[-1]
        for (la, ll, _), (ra, rl, _) in zip(local, remote, strict=True):
            assert ll == rl
            ctypes.memmove(int(la), int(ra), int(rl))
        return "DONE"

    def check_xfer_state(self, _handle: Any) -> str:
        return "DONE"

    def send_notif(self, name: str, message: bytes) -> None:
        AGENTS[name].notifs.setdefault(self.name, []).append(message)

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        out, self.notifs = self.notifs, {}
        return out


@pytest.fixture(autouse=True)
def fake_nixl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nixl_transport, "load_nixl", lambda: None)
    monkeypatch.setattr(nixl_transport, "apply_ucx_settings", lambda _tls: "fake")
    monkeypatch.setattr(
        nixl_transport, "create_agent", lambda _api, name, progress_wakeup_us, **_: FakeAgent(name)
    )


def agent(name: str, shards: Any, leases: LeaseTable | None = None) -> KVTransferAgent:
    return tcp_heads_agent(name, shards, leases, "nixl")  # the fake agent stands in for NIXL's


def rank_of(address: int, tensors: list[torch.Tensor]) -> int:
    for rank, t in enumerate(tensors):
        if t.data_ptr() <= address < t.data_ptr() + t.numel() * t.element_size():
            return rank
    raise AssertionError(f"address {address:#x} is in no rank's tensor")


@pytest.mark.parametrize(("src", "dst"), [((2, 1), (1, 1)), ((2, 2), (1, 3)), ((1, 2), (2, 1))])
async def test_one_read_posts_every_rank_pairs_pieces(
    src: tuple[int, int], dst: tuple[int, int]
) -> None:
    full = torch.randn(BLOCKS, 5, 2, 4, 2, 8)
    freed: list[str] = []
    leases = LeaseTable(on_free=lambda rid, _ids: freed.append(rid))
    owner_shards, reader_shards = split(full, *src), split(torch.zeros_like(full), *dst)
    owner, reader = agent("owner", owner_shards, leases), agent("reader", reader_shards)
    try:
        leases.grant("r1", [3, 5], 30.0)
        result = await reader.read_blocks(owner.info, [3, 5], [1, 6], request_id="r1")
        (posted,) = AGENTS[reader.info.agent_name + nixl_transport.READER_SUFFIX].posted
        local, remote = posted
        senders = {rank_of(int(a), owner_shards.tensors) for a in remote[:, 0]}
        receivers = {rank_of(int(a), reader_shards.tensors) for a in local[:, 0]}
        assert senders == set(range(owner_shards.size))  # every sending rank in one request
        assert receivers == set(range(reader_shards.size))
        assert int(local[:, 1].sum()) == result.nbytes == 2 * full[0].numel() * 4  # one copy
        for t, (layers, heads) in zip(reader_shards.tensors, reader_shards.parts, strict=True):
            want = full[[3, 5], layers.start : layers.stop, :, :, heads.start : heads.stop]
            assert torch.equal(t[[1, 6]], want)
        await wait_released(owner, freed)
        assert freed == ["r1"]
    finally:
        owner.close()
        reader.close()
        AGENTS.clear()
