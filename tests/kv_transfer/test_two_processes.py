"""Two real processes per transport: an owner (owner_process.py) and this test as the reader."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kv_transfer import (
    KVTransferAgent,
    PeerInfo,
    PeerUnavailable,
    TransferConfig,
    TransferError,
    TransferTimeout,
    nixl_available,
    nixl_loader,
    tcp_client,
)
from kv_transfer.tcp_protocol import Kind

sys.path.insert(0, str(Path(__file__).parent))
from owner_process import FINGERPRINT, LAYOUT, SHAPE, reference_kv

OWNER_SCRIPT = Path(__file__).with_name("owner_process.py")
TRANSPORTS = [
    "tcp",
    pytest.param("nixl", marks=pytest.mark.skipif(not nixl_available(), reason="needs NIXL")),
]
READER_BLOCKS = 40


class OwnerProcess:
    """An owner process and its JSON-lines command channel. Starts at once, waited for on the
    first use of `info` (so that its start overlaps other setup)."""

    def __init__(
        self, transport: str, seed: int, node: str, port: int = 0, device: str = "cpu"
    ) -> None:
        self.seed = seed
        args = ["--transport", transport, "--seed", str(seed), "--node", node, "--port", str(port)]
        args += ["--device", device]
        self.proc = subprocess.Popen(
            [sys.executable, str(OWNER_SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._info: PeerInfo | None = None

    @property
    def info(self) -> PeerInfo:
        if self._info is None:
            self._info = PeerInfo.from_json(self._read_line(timeout=60)["info"])
        return self._info

    def _read_line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"owner process gave no answer (exit code {self.proc.poll()})")
        return dict(json.loads(line))

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.info is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read_line(timeout=10)

    def wait_counts(self, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Counts once `done(counts)` holds (the owner drains releases every 20 ms)."""
        give_up = time.monotonic() + 5
        counts = self.ask(op="counts")
        while not done(counts) and time.monotonic() < give_up:
            time.sleep(0.02)
            counts = self.ask(op="counts")
        return counts

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module", params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def reader(transport: str, owners: dict[str, OwnerProcess]) -> Iterator[KVTransferAgent]:
    kv = torch.zeros((READER_BLOCKS, *SHAPE[1:]))
    config = TransferConfig("reader", transport=transport)
    agent = KVTransferAgent(kv, fingerprint=FINGERPRINT, layout=LAYOUT, config=config)
    yield agent
    agent.close()


@pytest.fixture(scope="module")
def owners(transport: str) -> Iterator[dict[str, OwnerProcess]]:
    """The live owner of this transport, shared by tests; a test that kills it replaces it."""
    pool = {"owner": OwnerProcess(transport, seed=1, node="owner")}
    yield pool
    for owner in pool.values():
        owner.kill()


@pytest.fixture
def owner(owners: dict[str, OwnerProcess], transport: str) -> OwnerProcess:
    if "owner" not in owners or not owners["owner"].alive():
        owners["owner"] = OwnerProcess(transport, seed=1, node="owner")
    return owners["owner"]


def local_kv(agent: KVTransferAgent) -> torch.Tensor:
    return agent.region.kv


async def test_random_blocks_arrive_byte_equal(
    reader: KVTransferAgent, owner: OwnerProcess
) -> None:
    remote = [5, 2, 9, 30, 31, 0, 47]  # out of order, with a contiguous pair
    local = [1, 17, 3, 8, 9, 39, 20]
    before = local_kv(reader).clone()
    result = await reader.read_blocks(owner.info, remote, local, request_id="plain")
    expected = reference_kv(owner.seed)
    assert torch.equal(local_kv(reader)[local], expected[remote])
    untouched = [i for i in range(READER_BLOCKS) if i not in local]
    assert torch.equal(local_kv(reader)[untouched], before[untouched])
    assert result.nbytes == len(remote) * reader.region.block_bytes
    assert result.seconds > 0


async def test_a_read_reports_what_the_transport_library_measured(
    reader: KVTransferAgent, owner: OwnerProcess, transport: str
) -> None:
    """A traced READ's result brings NIXL's own report of it (backend, its timing, bytes,
    descriptors) and the UCX_TLS in force; TCP reports nothing of the kind. Either way the
    wire time (first post to last byte) is a fact, within the window."""
    trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    result = await reader.read_blocks(
        owner.info, [3, 4, 7], [3, 4, 7], request_id="facts", trace=trace
    )
    assert 0 < float(result.facts["splitserve.wire_ms"]) <= result.window_s * 1e3
    if transport != "nixl":
        assert set(result.facts) == {"splitserve.wire_ms"}
        return
    facts = result.facts
    assert facts["splitserve.nixl.backend"] == "UCX"
    assert facts["splitserve.nixl.bytes"] == result.nbytes
    assert facts["splitserve.nixl.transfers"] == 1
    assert 1 <= int(facts["splitserve.nixl.descs"]) <= 3  # adjacent blocks may merge
    assert 0 < int(facts["splitserve.nixl.xfer_us"]) <= result.seconds * 1e6
    assert facts["splitserve.nixl.ucx_tls"] == os.environ.get("UCX_TLS", "unset")


async def test_connect_ahead_of_the_first_read(
    reader: KVTransferAgent, owner: OwnerProcess
) -> None:
    reader.forget_peer(owner.info.node_name)
    await reader.connect(owner.info)
    await reader.read_blocks(owner.info, [11, 13], [12, 14], request_id="after-connect")
    assert torch.equal(local_kv(reader)[[12, 14]], reference_kv(owner.seed)[[11, 13]])


async def test_release_frees_the_blocks_once(reader: KVTransferAgent, owner: OwnerProcess) -> None:
    start = owner.ask(op="counts")
    blocks = owner.ask(op="grant", request_id="rel-1", num_blocks=5, ttl_s=60)["blocks"]
    assert owner.ask(op="counts")["free"] == start["free"] - 5
    await reader.read_blocks(owner.info, blocks, [0, 2, 4, 6, 8], request_id="rel-1")
    assert torch.equal(local_kv(reader)[[0, 2, 4, 6, 8]], reference_kv(owner.seed)[blocks])
    counts = owner.wait_counts(lambda c: c["free"] == start["free"])
    assert counts["free"] == start["free"] and counts["held"] == 0
    assert counts["freed"].count("rel-1") == 1
    assert owner.ask(op="release", request_id="rel-1") == {"released": False}  # the HTTP path


async def test_a_release_notice_without_a_read_ends_the_lease(
    reader: KVTransferAgent, owner: OwnerProcess
) -> None:
    """A decode node that holds every prompt block reads nothing: the notice alone frees the
    owner's blocks, long before the lease would expire."""
    start = owner.ask(op="counts")
    owner.ask(op="grant", request_id="cached-all", num_blocks=4, ttl_s=60)
    assert owner.ask(op="counts")["held"] == 4
    before, read_before = local_kv(reader).clone(), reader.counters.bytes
    await reader.release(owner.info, "cached-all")
    counts = owner.wait_counts(lambda c: "cached-all" in c["freed"])
    assert counts["freed"].count("cached-all") == 1
    assert counts["free"] == start["free"] and counts["held"] == 0
    assert torch.equal(local_kv(reader), before) and reader.counters.bytes == read_before


def fail_release_notices(monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
    """Make every release notice this process sends fail."""
    if transport == "nixl":
        api = nixl_loader.load_nixl()

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("notification refused")

        monkeypatch.setattr(api.nixl_agent, "send_notif", refuse)
        return
    send = tcp_client.send_json

    def send_json(sock: Any, kind: Kind, body: dict[str, Any]) -> None:
        if kind is Kind.RELEASE:
            raise BrokenPipeError("connection lost")
        send(sock, kind, body)

    monkeypatch.setattr(tcp_client, "send_json", send_json)


async def test_a_lost_release_notice_is_counted_and_the_lease_expires(
    reader: KVTransferAgent,
    owner: OwnerProcess,
    transport: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The READ returns once its blocks are in; its release notice goes after. One that
    cannot be sent leaves the READ a success: the failure is logged and counted, and the
    owner's lease frees the blocks at its expiry."""
    start = owner.ask(op="counts")
    blocks = owner.ask(op="grant", request_id="lost-1", num_blocks=3, ttl_s=0.5)["blocks"]
    failed = reader.counters.release_failed
    fail_release_notices(monkeypatch, transport)
    with caplog.at_level(logging.WARNING, logger="kv_transfer"):
        await reader.read_blocks(owner.info, blocks, [20, 21, 22], request_id="lost-1")
        assert torch.equal(local_kv(reader)[[20, 21, 22]], reference_kv(owner.seed)[blocks])
        give_up = time.monotonic() + 10
        while reader.counters.release_failed == failed and time.monotonic() < give_up:
            await asyncio.sleep(0.01)
    assert reader.counters.release_failed == failed + 1
    assert "release notice to" in caplog.text
    counts = owner.wait_counts(lambda c: "lost-1" in c["freed"])
    assert counts["free"] == start["free"] and counts["held"] == 0
    monkeypatch.undo()
    await reader.read_blocks(owner.info, [5], [5], request_id="after-lost")
    assert torch.equal(local_kv(reader)[[5]], reference_kv(owner.seed)[[5]])


async def test_lease_expiry_frees_unreleased_blocks(owner: OwnerProcess) -> None:
    start = owner.ask(op="counts")
    owner.ask(op="grant", request_id="exp-1", num_blocks=3, ttl_s=0.3)
    assert owner.ask(op="counts")["held"] == 3
    counts = owner.wait_counts(lambda c: "exp-1" in c["freed"])
    assert counts["free"] == start["free"] and counts["held"] == 0 and counts["leases"] == 0


def _stopped(pid: int) -> bool:
    """Every thread of `pid` stopped: SIGSTOP takes effect as each thread is next scheduled,
    so a request sent at once could still be served."""
    states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in _tasks(pid)]
    return all(state in "Tt" for state in states)


def _tasks(pid: int) -> list[Path]:
    return list(Path(f"/proc/{pid}/task").iterdir())


async def test_stalled_peer_times_out_without_spinning(
    reader: KVTransferAgent, owner: OwnerProcess
) -> None:
    await reader.read_blocks(owner.info, [1], [1], request_id="warm")  # connection cached
    owner.signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        while not _stopped(owner.proc.pid):
            assert time.monotonic() < deadline, "the owner did not stop within 30 s"
            await asyncio.sleep(0.01)
        cpu_before, t = _cpu_seconds(), time.monotonic()
        with pytest.raises(TransferTimeout):
            await reader.read_blocks(owner.info, [3, 4], [3, 4], request_id="st", deadline_s=1.0)
        waited, cpu = time.monotonic() - t, _cpu_seconds() - cpu_before
        assert 0.9 < waited < 3.0
        assert cpu < 0.5 * waited, f"{cpu:.2f} s of CPU while waiting {waited:.2f} s"
        task = asyncio.create_task(
            reader.read_blocks(owner.info, [5], [5], request_id="cx", deadline_s=5)
        )
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert reader.transport.inflight() == 0
    finally:
        owner.signal(signal.SIGCONT)
    await reader.read_blocks(owner.info, [6, 7], [6, 7], request_id="after")
    assert torch.equal(local_kv(reader)[[6, 7]], reference_kv(owner.seed)[[6, 7]])


async def test_dead_peer_fails_in_time_and_restarted_peer_is_detected(
    reader: KVTransferAgent, owners: dict[str, OwnerProcess], owner: OwnerProcess, transport: str
) -> None:
    await reader.read_blocks(owner.info, [1], [1], request_id="warm")
    owner.kill()
    t = time.monotonic()
    with pytest.raises(TransferError):
        await reader.read_blocks(owner.info, [2, 3], [2, 3], request_id="dead", deadline_s=2.0)
    assert time.monotonic() - t < 5.0
    with pytest.raises(PeerUnavailable):
        await reader.connect(owner.info, deadline_s=2.0)
    assert reader.transport.inflight() == 0

    port = owner.info.tcp_port or 0  # TCP: the new process takes over the same port
    restarted = OwnerProcess(transport, seed=7, node=owner.info.node_name, port=port)
    owners["owner"] = restarted
    assert restarted.info.incarnation != owner.info.incarnation
    start = restarted.ask(op="counts")
    with pytest.raises(PeerUnavailable):  # the old PeerInfo is refused, never served
        await reader.read_blocks(owner.info, [2], [2], request_id="stale", deadline_s=2.0)
    blocks = restarted.ask(op="grant", request_id="new-1", num_blocks=4, ttl_s=60)["blocks"]
    await reader.read_blocks(restarted.info, blocks, [10, 11, 12, 13], request_id="new-1")
    assert torch.equal(local_kv(reader)[[10, 11, 12, 13]], reference_kv(7)[blocks])
    counts = restarted.wait_counts(lambda c: c["free"] == start["free"])
    assert counts["free"] == start["free"] and counts["held"] == 0
    assert reader.transport.inflight() == 0


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def test_an_idle_agent_does_not_spin(reader: KVTransferAgent) -> None:
    cpu_before, t = _cpu_seconds(), time.monotonic()
    time.sleep(0.5)
    cpu, waited = _cpu_seconds() - cpu_before, time.monotonic() - t
    assert cpu < 0.3 * waited, f"{cpu:.2f} s of CPU in {waited:.2f} s of idling"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_vram_blocks_arrive_byte_equal(transport: str) -> None:
    owner = OwnerProcess(transport, seed=5, node="gpu-owner", device="cuda")
    kv = torch.zeros((READER_BLOCKS, *SHAPE[1:]), device="cuda")
    config = TransferConfig("gpu-reader", transport=transport)
    reader = KVTransferAgent(kv, fingerprint=FINGERPRINT, layout=LAYOUT, config=config)
    try:
        assert owner.info.mem_type == "VRAM" and reader.info.mem_type == "VRAM"
        remote, local = [7, 1, 2, 40], [0, 30, 31, 5]
        blocks = owner.ask(op="grant", request_id="g", num_blocks=2, ttl_s=60)["blocks"]
        await reader.read_blocks(owner.info, remote, local, request_id="other")
        await reader.read_blocks(owner.info, blocks, [10, 11], request_id="g")
        expected = reference_kv(owner.seed)
        assert torch.equal(kv[local].cpu(), expected[remote])
        assert torch.equal(kv[[10, 11]].cpu(), expected[blocks])
        assert owner.wait_counts(lambda c: c["held"] == 0)["held"] == 0
    finally:
        reader.close()
        owner.kill()
