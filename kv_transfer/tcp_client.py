"""The reader side of the TCP fallback: cached connections and one blocking READ per thread.

Every socket call has the time left before the deadline as its timeout, and `BlockRead.abort`
shuts the socket down from another thread, so a READ never outlives its deadline or its
caller by more than a moment. Bytes land directly in the local blocks (CPU) or in a pinned
staging buffer that is then copied to the device (CUDA).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

import torch

from kv_transfer.deadline import Deadline
from kv_transfer.errors import (
    LayoutMismatch,
    PeerUnavailable,
    TransferCancelled,
    TransferError,
    TransferRefused,
    TransferTimeout,
)
from kv_transfer.peer_info import Identity, PeerInfo
from kv_transfer.region import KVRegion
from kv_transfer.tcp_protocol import (
    Kind,
    recv_header,
    recv_into_exact,
    recv_json,
    recv_json_body,
    send_json,
    shutdown_quietly,
)
from kv_transfer.transport import ReadWindow
from kv_transfer.version import PROTOCOL_VERSION, mismatch, peer_version

logger = logging.getLogger(__name__)


class ConnectionPool:
    """Idle, handshaken sockets per owner endpoint: the owner process's block server (its
    agent name) or one of its ranks' own listeners (``agent#rank``). Thread safe."""

    def __init__(self) -> None:
        self._idle: dict[str, list[socket.socket]] = {}
        self._lock = threading.Lock()

    def take(self, peer: PeerInfo, key: str | None = None) -> socket.socket | None:
        with self._lock:
            stale = [
                n for n in self._idle if _agent(n) != peer.agent_name and _node(n) == peer.node_name
            ]
            for name in stale:  # the peer restarted: its old connections are useless
                self._close(name)
            idle = self._idle.get(key or peer.agent_name)
            return idle.pop() if idle else None

    def give_back(self, peer: PeerInfo, sock: socket.socket, key: str | None = None) -> None:
        with self._lock:
            self._idle.setdefault(key or peer.agent_name, []).append(sock)

    def forget(self, node_name: str) -> None:
        with self._lock:
            for name in [n for n in self._idle if _node(n) == node_name]:
                self._close(name)

    def close(self) -> None:
        with self._lock:
            for name in list(self._idle):
                self._close(name)

    def _close(self, name: str) -> None:
        for sock in self._idle.pop(name):
            sock.close()


class BlockRead:
    """One READ, run on a reader thread by `run`; `abort` unblocks it from another thread."""

    def __init__(
        self,
        pool: ConnectionPool,
        region: KVRegion,
        identity: Identity,
        peer: PeerInfo,
        ids: tuple[list[int], list[int]],
        request_id: str,
        deadline: Deadline,
    ) -> None:
        self.pool, self.region, self.identity = pool, region, identity
        self.peer, self.request_id, self.deadline = peer, request_id, deadline
        self.remote_ids, self.local_ids = ids
        # where to dial, and the pool's name for it: the owner's block server by default
        self.address: tuple[str | None, int | None] = (peer.tcp_host, peer.tcp_port)
        self.key = peer.agent_name
        self.label = peer.agent_name  # who this READ talks to, in errors
        self._sock: socket.socket | None = None
        self._aborted = False
        self.window = ReadWindow()  # the caller's, to time the reads
        self.on_data: Callable[[], None] = _nothing  # the blocks are in (before the RELEASE)
        self.release_failed = False  # the RELEASE after the blocks could not be sent

    def abort(self) -> None:
        self._aborted = True
        if self._sock is not None:
            shutdown_quietly(self._sock)

    def run(self) -> None:
        """Raises only TransferError subclasses."""
        for attempt in (1, 2):  # a cached socket may have died idle: retry once on a new one
            if self._aborted:
                raise TransferCancelled("transfer cancelled")
            cached = self.pool.take(self.peer, self.key)
            try:
                sock = cached or self._dial()
                self._exchange_on(sock)
            except _ReleaseFailed:
                return  # the blocks are in; the owner's lease ends at its expiry
            except _StaleSocket:
                if self._aborted:
                    raise TransferCancelled("transfer cancelled") from None
                if cached is None or attempt == 2:
                    raise PeerUnavailable(f"{self.label} closed the connection") from None
                self.window.retried()
                continue
            self.pool.give_back(self.peer, sock, self.key)
            return

    def release_only(self) -> None:
        """Send the release notice on a pooled (or new) connection; no blocks move."""
        for attempt in (1, 2):  # like run: a cached socket may have died idle
            cached = self.pool.take(self.peer)
            sock = cached or self._guarded(self._connect)
            try:
                sock.settimeout(self.deadline.remaining())
                send_json(sock, Kind.RELEASE, {"request_id": self.request_id})
            except OSError as exc:
                sock.close()
                if cached is None or attempt == 2:
                    raise PeerUnavailable(f"{self.peer.agent_name} failed: {exc}") from None
                continue
            self.pool.give_back(self.peer, sock)
            return

    def connect_only(self) -> None:
        """Open a connection and leave it in the pool for the next READ."""
        self.pool.give_back(self.peer, self._guarded(self._connect))

    def _exchange_on(self, sock: socket.socket) -> None:
        self._sock = sock
        try:
            if self._aborted:  # abort() may have run before the socket was visible
                raise TransferCancelled("transfer cancelled")
            self._guarded(self._exchange)
        except BaseException:
            sock.close()
            raise

    def _dial(self) -> socket.socket:
        """A new connection; the time it takes is set-up, not moving blocks."""
        began = time.perf_counter()
        try:
            return self._guarded(self._connect)
        finally:
            self.window.setup(time.perf_counter() - began)

    def _guarded(self, step: Callable[[], socket.socket]) -> socket.socket:
        """Run a socket step, mapping every failure to a TransferError (or _StaleSocket)."""
        try:
            return step()
        except (TransferError, _StaleSocket):
            raise
        except TimeoutError:
            raise TransferTimeout(
                f"READ from {self.label} exceeded its deadline of {self.deadline.budget_s:.3f} s"
            ) from None
        except (OSError, ValueError) as exc:
            if self._aborted:
                raise TransferCancelled("transfer cancelled") from None
            raise PeerUnavailable(f"{self.label} failed: {exc}") from None

    def _connect(self) -> socket.socket:
        host, port = self.address
        assert host is not None and port is not None
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        self._sock = sock  # abort() can interrupt the connect and the handshake
        try:
            if self._aborted:
                raise TransferCancelled("transfer cancelled")
            sock.settimeout(self.deadline.remaining())
            sock.connect(address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._hello(sock)
        except BaseException:
            sock.close()
            raise
        return sock

    def _hello(self, sock: socket.socket) -> None:
        me = self.identity
        hello = {"agent": me.agent_name, "fingerprint": me.fingerprint, "layout": me.layout}
        ask = {"expect": self.peer.incarnation, "protocol": PROTOCOL_VERSION, "token": me.token}
        send_json(sock, Kind.HELLO, {**hello, **ask})
        kind, body = recv_json(sock)
        if kind is Kind.ERROR:
            raise refusal_error(body, me.layout, self.peer)
        if kind is not Kind.WELCOME:
            raise PeerUnavailable(f"{self.peer.agent_name} answered HELLO with {kind.name}")
        problem = mismatch(peer_version(body), PROTOCOL_VERSION)
        if problem is not None:
            raise TransferRefused(f"{self.peer.agent_name}: {problem}")

    def _exchange(self) -> socket.socket:
        sock = self._sock
        assert sock is not None
        try:
            sock.settimeout(self.deadline.remaining())
            self.window.post()
            body: dict[str, object] = {"request_id": self.request_id, "block_ids": self.remote_ids}
            if self.window.trace:  # the serving side's span joins the reader's trace
                body["trace"] = self.window.trace
            send_json(sock, Kind.READ, body)
            kind, length = recv_header(sock)
        except ConnectionError as exc:  # nothing came back: the socket died while idle
            raise _StaleSocket() from exc
        if kind is Kind.ERROR:
            body = recv_json_body(sock, length)
            raise refusal_error(body, self.identity.layout, self.peer)
        expected = len(self.local_ids) * self.region.block_bytes
        if kind is not Kind.DATA or length != expected:
            raise TransferError(f"{self.peer.agent_name} sent {kind.name} of {length} bytes")
        self._receive(sock)
        self.window.complete()
        self.on_data()
        self._release_on(sock)
        return sock

    def _release_on(self, sock: socket.socket) -> None:
        """Send the RELEASE after the blocks; a failure is logged and noted, not raised (the
        READ has succeeded: the caller already has its blocks)."""
        try:
            send_json(sock, Kind.RELEASE, {"request_id": self.request_id})
        except OSError as exc:
            self.release_failed = True
            logger.warning("release notice to %s failed: %s", self.label, exc)
            raise _ReleaseFailed() from exc

    def _receive(self, sock: socket.socket) -> None:
        region = self.region
        if not region.is_cuda:
            for block_id in self.local_ids:
                sock.settimeout(self.deadline.remaining())
                recv_into_exact(sock, region.host_view(block_id))
            return
        # staging: [n, block_bytes] uint8 in pinned host memory
        staging = torch.empty((len(self.local_ids), region.block_bytes), dtype=torch.uint8)
        staging = staging.pin_memory()
        for row in range(len(self.local_ids)):
            sock.settimeout(self.deadline.remaining())
            recv_into_exact(sock, staging[row].numpy().data)
        index = torch.tensor(self.local_ids, device=region.kv.device)
        region.bytes.index_copy_(0, index, staging.to(region.kv.device, non_blocking=True))
        torch.cuda.synchronize(region.kv.device)


class _ReleaseFailed(Exception):
    """The RELEASE after a completed READ could not be sent: drop the socket, keep the READ."""


def _nothing() -> None:
    pass


class _StaleSocket(Exception):
    """A cached connection died before the owner answered: safe to retry on a new one."""


def refusal_error(body: dict[str, object], local_layout: str, peer: PeerInfo) -> TransferError:
    """Map an owner's ERROR message to the matching TransferError."""
    code, message = body.get("code"), str(body.get("message"))
    if code == "layout":
        return LayoutMismatch(local_layout, str(body.get("layout")), peer.agent_name)
    if code in ("unauthorized", "protocol"):
        return TransferRefused(f"{peer.agent_name} refused the transfer: {message}")
    if code == "restarted":
        return PeerUnavailable(f"peer restarted since its PeerInfo was published: {message}")
    return TransferError(f"{peer.agent_name} refused the transfer: {message}")


def _agent(key: str) -> str:
    return key.split("#", 1)[0]


def _node(key: str) -> str:
    return _agent(key).rsplit(".", 1)[0]
