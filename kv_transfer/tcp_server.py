"""The owner side of the TCP fallback: serves READs of registered blocks from threads.

Blocks are sent straight from the tensor's memory (no copy on CPU). A reader first says
HELLO with its layout fingerprint and the incarnation it expects; a different layout or a
restarted process (another incarnation, maybe on the same port) is refused with a reason.
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kv_transfer.peer_info import Identity
from kv_transfer.region import KVRegion, check_block_ids
from kv_transfer.shards import KVShards
from kv_transfer.tcp_heads import local_shards, serve_heads
from kv_transfer.tcp_protocol import (
    Kind,
    recv_json,
    send_data_header,
    send_json,
    shutdown_quietly,
)
from kv_transfer.transport import Served, ServedHook, trace_of
from kv_transfer.version import PROTOCOL_VERSION, mismatch, peer_version

logger = logging.getLogger(__name__)


def token_matches(given: object, expected: str | None) -> bool:
    """Constant-time check of the token a reader showed (no token expected: any passes)."""
    if expected is None:
        return True
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


class BlockServer:
    """Listens on (host, port); one thread per reader connection."""

    def __init__(
        self,
        region: KVRegion,
        identity: Identity,
        host: str,
        port: int,
        on_release: Callable[[str], None],
        shards: KVShards | None = None,
        first_rank: int = 0,
    ) -> None:
        """``shards``: the ranks ``first_rank`` .. of the node whose cells this server sends
        (a rank's own listener: its one tensor, ``first_rank`` its rank)."""
        self._region = region
        self._shards = shards
        self._first_rank = first_rank
        self._identity = identity
        self._on_release = on_release
        self._listener = socket.create_server((host, port))  # SO_REUSEADDR: restart on a port
        self.port: int = self._listener.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.on_served: ServedHook | None = None  # READs that carried a trace context
        threading.Thread(target=self._accept, name="kv-tcp-accept", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        shutdown_quietly(self._listener)
        self._listener.close()
        with self._lock:
            for conn in self._conns:
                shutdown_quietly(conn)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _addr = self._listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self._handshake(conn):
                while True:
                    kind, body = recv_json(conn)
                    self._handle(conn, kind, body)
        except (OSError, ValueError) as exc:  # closed, reset, or garbage
            logger.debug("reader connection ended: %s", exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _handshake(self, conn: socket.socket) -> bool:
        kind, hello = recv_json(conn)
        me = self._identity
        if kind is not Kind.HELLO:
            return False
        if not token_matches(hello.get("token"), me.token):
            _refuse(conn, "unauthorized", "missing or wrong cluster token")
            return False
        if hello.get("fingerprint") != me.fingerprint:
            _refuse(conn, "layout", f"layout {me.layout} differs", layout=me.layout)
            return False
        if hello.get("expect") != me.incarnation:
            _refuse(conn, "restarted", f"this is {me.agent_name}, not {hello.get('expect')}")
            return False
        problem = mismatch(peer_version(hello), PROTOCOL_VERSION)
        if problem is not None:
            _refuse(conn, "protocol", problem)
            return False
        send_json(conn, Kind.WELCOME, {"agent": me.agent_name, "protocol": PROTOCOL_VERSION})
        return True

    def _handle(self, conn: socket.socket, kind: Kind, body: dict[str, Any]) -> None:
        if kind is Kind.RELEASE:
            request_id = body.get("request_id")
            if isinstance(request_id, str):
                self._on_release(request_id)
        elif kind is Kind.READ:
            start = time.monotonic()
            serve = self._serve_heads if "heads" in body else self._serve_blocks
            nbytes = serve(conn, body)
            trace, hook, request_id = trace_of(body), self.on_served, body.get("request_id")
            if nbytes and trace and hook is not None and isinstance(request_id, str):
                hook(Served(request_id, trace, start, time.monotonic(), nbytes))
        else:
            _refuse(conn, "bad_request", f"unexpected message {kind.name}")

    def _serve_blocks(self, conn: socket.socket, body: dict[str, Any]) -> int:
        """Send the blocks a READ names; the bytes sent (0 when refused)."""
        ids = body.get("block_ids")
        try:
            if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                raise ValueError("block_ids must be a list of integers")
            check_block_ids(ids, self._region.num_blocks, "block_ids", unique=False)
        except ValueError as exc:
            _refuse(conn, "bad_request", str(exc))
            return 0
        nbytes = len(ids) * self._region.block_bytes
        send_data_header(conn, nbytes)
        for block_id in ids:
            conn.sendall(self._region.read_block(block_id))
        return nbytes

    def _serve_heads(self, conn: socket.socket, body: dict[str, Any]) -> int:
        """Send a READ's heads and layers of its blocks; the bytes sent (0 when refused)."""
        try:
            shards = local_shards(self._region.kv, self._shards)
        except ValueError as exc:
            _refuse(conn, "bad_request", str(exc))
            return 0
        problem = serve_heads(conn, body, shards, self._first_rank)
        if isinstance(problem, str):
            _refuse(conn, "bad_request", problem)
            return 0
        return problem


def _refuse(conn: socket.socket, code: str, message: str, **extra: str) -> None:
    send_json(conn, Kind.ERROR, {"code": code, "message": message, **extra})
