"""Each sending rank's cells move on a connection of their own, every (sending rank,
receiving rank) pair at once; a rank's own listener serves its shard; a sending rank that
dies or hangs mid-read ends the READ with a TransferError within its deadline."""

from __future__ import annotations

import dataclasses
import json
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kv_transfer import (
    KVTransferAgent,
    LeaseTable,
    PeerInfo,
    PeerUnavailable,
    TransferError,
    TransferTimeout,
    tcp_heads,
    tcp_server,
)
from kv_transfer.rank_server import close_rank_servers, serve_rank_kv
from kv_transfer.tcp_heads import serve_heads
from kv_transfer.tcp_transport import TcpTransport
from tests.kv_transfer.test_tcp_heads import BLOCKS, agent, split, wait_released

RANK_SCRIPT = Path(__file__).with_name("rank_process.py")


def check(reader_shards: Any, full: torch.Tensor, remote: list[int], local: list[int]) -> None:
    for t, span in zip(reader_shards.tensors, reader_shards.spans, strict=True):
        assert torch.equal(t[local], full[remote][:, :, :, :, span.start : span.stop])


def peak(reader: KVTransferAgent) -> int:
    assert isinstance(reader.transport, TcpTransport)
    return reader.transport.peak_inflight


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """(listener's first rank, sending rank asked) of every head READ the owners serve."""
    seen: list[tuple[int, int]] = []

    def record(conn: socket.socket, body: dict[str, Any], shards: Any, first: int = 0) -> Any:
        seen.append((first, body["rank"]))
        return serve_heads(conn, body, shards, first)

    monkeypatch.setattr(tcp_server, "serve_heads", record)
    yield seen
    close_rank_servers()


@pytest.mark.parametrize(
    ("m", "n", "heads", "kv_heads", "pairs"),
    [(2, 1, 4, 2, 2), (1, 2, 4, 2, 2), (2, 2, 4, 2, 2), (4, 2, 8, 4, 4)],
)
async def test_every_rank_pair_is_in_flight_at_once(
    monkeypatch: pytest.MonkeyPatch, m: int, n: int, heads: int, kv_heads: int, pairs: int
) -> None:
    """The owner holds each pair's READ until every pair's has arrived: READs made one
    after the other would break the barrier (and the transfer)."""
    barrier = threading.Barrier(pairs, timeout=20.0)

    def all_at_once(conn: socket.socket, body: dict[str, Any], shards: Any, first: int = 0) -> Any:
        barrier.wait()
        return serve_heads(conn, body, shards, first)

    monkeypatch.setattr(tcp_server, "serve_heads", all_at_once)
    full = torch.randn(BLOCKS, 2, 2, 4, kv_heads, 8)
    freed: list[str] = []
    leases = LeaseTable(on_free=lambda rid, _ids: freed.append(rid))
    reader_shards = split(torch.zeros_like(full), n, heads)
    owner, reader = agent("owner", split(full, m, heads), leases), agent("reader", reader_shards)
    try:
        leases.grant("r1", [3, 5], 30.0)
        result = await reader.read_blocks(owner.info, [3, 5], [1, 6], request_id="r1")
        check(reader_shards, full, [3, 5], [1, 6])
        assert result.nbytes == 2 * full[0].numel() * full.element_size()  # one copy
        assert peak(reader) == pairs
        await wait_released(owner, freed)
        assert freed == ["r1"]
    finally:
        owner.close()
        reader.close()


async def test_each_rank_serves_its_own_cells_from_its_own_listener(
    served: list[tuple[int, int]],
) -> None:
    full = torch.randn(BLOCKS, 2, 2, 4, 4, 8)
    freed: list[str] = []
    leases = LeaseTable(on_free=lambda rid, _ids: freed.append(rid))
    owner_shards, reader_shards = split(full, 4, 8), split(torch.zeros_like(full), 1, 8)
    owner, reader = agent("owner", owner_shards, leases), agent("reader", reader_shards)
    try:
        listeners = owner.rank_listeners()
        tensors = owner_shards.tensors[1:]
        owner.use_rank_listeners(
            [
                serve_rank_kv(t, r, s)
                for r, (t, s) in enumerate(zip(tensors, listeners, strict=True), 1)
            ]
        )
        info = PeerInfo.from_json(owner.info.to_json())
        assert info == owner.info and [s.tcp_port > 0 for s in info.shards] == [0, 1, 1, 1]
        published = json.loads(owner.info.to_json())["shards"]
        assert ["tcp_port" in s for s in published] == [False, True, True, True]
        leases.grant("r1", [2, 4], 30.0)
        result = await reader.read_blocks(info, [2, 4], [0, 7], request_id="r1")
        check(reader_shards, full, [2, 4], [0, 7])
        assert result.nbytes == 2 * full[0].numel() * full.element_size()
        assert sorted(served) == [(0, 0), (1, 1), (2, 2), (3, 3)]  # rank r by its listener
        await wait_released(owner, freed)  # the release still goes to rank 0's server
        assert freed == ["r1"]
    finally:
        owner.close()
        reader.close()


async def test_a_rank_listener_refuses_cells_it_does_not_hold(
    served: list[tuple[int, int]],
) -> None:
    full = torch.randn(BLOCKS, 2, 2, 4, 2, 8)
    owner_shards, reader_shards = split(full, 2, 4), split(torch.zeros_like(full), 1, 4)
    owner, reader = agent("owner", owner_shards), agent("reader", reader_shards)
    try:
        (listener,) = owner.rank_listeners()
        owner.use_rank_listeners([serve_rank_kv(owner_shards.tensors[1], 1, listener)])
        zero, one = owner.info.shards
        wrong = dataclasses.replace(zero, tcp_host=one.tcp_host, tcp_port=one.tcp_port)
        confused = dataclasses.replace(owner.info, shards=(wrong, one))  # rank 0's at rank 1
        with pytest.raises(TransferError, match="rank 0 does not hold"):
            await reader.read_blocks(confused, [1], [1], request_id="r")
    finally:
        owner.close()
        reader.close()


class RankProcess:
    """A sending rank in a process of its own (rank_process.py): its own TCP listener, or
    its own NIXL agent; `hello` is its first answer (the port, or the agent's metadata)."""

    def __init__(self, setup: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(RANK_SCRIPT), "--setup", json.dumps(setup)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.hello = self.line()

    def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60.0)
        line = self.proc.stdout.readline() if ready else ""
        assert line, f"rank process said nothing (exit code {self.proc.poll()})"
        return dict(json.loads(line))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(30.0)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.mark.parametrize(
    ("stop", "error", "deadline_s"),
    [(signal.SIGKILL, PeerUnavailable, 30.0), (signal.SIGSTOP, TransferTimeout, 1.5)],
    ids=["killed", "hung"],
)
async def test_a_sending_rank_that_dies_mid_read_fails_the_read_within_its_deadline(
    monkeypatch: pytest.MonkeyPatch, stop: signal.Signals, error: type, deadline_s: float
) -> None:
    """Rank 1's process sends 2 of 8 blocks, then is killed (or stopped) while the reader
    waits for the rest: the READ raises (killed: at once, naming the rank; hung: by its
    deadline), never hangs."""
    shape = (8, 2, 2, 4, 1, 8)
    owner_shards = split(torch.zeros(*shape[:4], 2, shape[5]), 2, 4)
    reader_shards = split(torch.zeros(*shape[:4], 2, shape[5]), 2, 4)  # block by block
    owner, reader = agent("owner", owner_shards), agent("reader", reader_shards)
    (listener,) = owner.rank_listeners()
    identity = dataclasses.asdict(listener.identity)
    setup = {"seed": 1, "shape": list(shape), "rank": 1, "identity": identity}
    setup |= {"heads": list(listener.heads), "layers": list(listener.layers)}
    rank = RankProcess({**setup, "num_kv_heads": 2, "stall_after": 2})
    stopped: list[int] = []
    real_recv = tcp_heads.recv_into_exact

    def recv_then_stop(sock: socket.socket, view: memoryview) -> None:
        real_recv(sock, view)
        if sock.getpeername()[1] == int(rank.hello["port"]) and not stopped:
            assert rank.line() == {"stalled": True}  # mid-send, 6 blocks to go
            stopped.append(rank.proc.pid)
            rank.proc.send_signal(stop)

    monkeypatch.setattr(tcp_heads, "recv_into_exact", recv_then_stop)
    try:
        owner.use_rank_listeners([("127.0.0.1", int(rank.hello["port"]))])
        start = time.monotonic()
        ids = list(range(8))
        with pytest.raises(error, match=r"sending rank 1|deadline") as caught:
            await reader.read_blocks(owner.info, ids, ids, request_id="r", deadline_s=deadline_s)
        elapsed = time.monotonic() - start
        assert stopped == [rank.proc.pid]
        assert elapsed < (10.0 if stop is signal.SIGKILL else deadline_s + 3.0), caught.value
    finally:
        rank.close()
        owner.close()
        reader.close()
