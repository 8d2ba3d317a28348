"""The NIXL transport: one-sided READs of registered blocks over UCX.

The reader loads the owner's agent metadata once per owner process (lazily, cached by agent
name, which embeds the owner's incarnation) and prepares the owner's block list once; each
READ is then one `make_prepped_xfer` over block indices. When a READ completes, NIXL delivers
the release notice (the request id) to the owner, whose driver thread queues it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kv_transfer.config import TransferConfig
from kv_transfer.deadline import Deadline
from kv_transfer.errors import (
    PeerUnavailable,
    TransferCancelled,
    TransferError,
    TransferTimeout,
)
from kv_transfer.nixl_driver import NixlDriver
from kv_transfer.nixl_loader import apply_ucx_defaults, create_agent, load_nixl
from kv_transfer.peer_info import Identity, PeerInfo, TransportKind
from kv_transfer.region import KVRegion, block_descriptors
from kv_transfer.transport import parse_release, release_message

logger = logging.getLogger(__name__)

_STUCK_GRACE_S = 2.0  # beyond the deadline, stop waiting for a driver that does not answer


@dataclass
class _Peer:
    info: PeerInfo
    dlist: Any  # prepared remote block list
    inflight: int = 0
    retired: bool = False


class NixlTransport:
    kind = TransportKind.NIXL

    def __init__(self, region: KVRegion, identity: Identity, config: TransferConfig) -> None:
        agent_name = identity.agent_name
        self.ucx_settings = apply_ucx_defaults(region.mem_type, config.ucx_tls)
        api = load_nixl()
        self._region = region
        self._releases: collections.deque[str] = collections.deque()
        self._peers: dict[str, _Peer] = {}  # by agent name; touched on the driver thread only
        self._driver = NixlDriver(agent_name, config.poll_interval_s, self._on_notif)
        try:
            self._metadata, self._local = self._driver.call(
                lambda: self._setup(api, agent_name, config.progress_wakeup_us)
            )
        except BaseException:
            self._driver.stop()
            raise

    def _setup(self, api: Any, name: str, wakeup_us: int) -> tuple[bytes, Any]:
        agent = create_agent(api, name, wakeup_us)
        self._driver.agent = agent
        agent.register_memory(self._region.kv)
        local = agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", self._region.descriptors(), self._region.mem_type
        )
        return agent.get_agent_metadata(), local

    def describe(self) -> str:
        return f"nixl (UCX backend, {self.ucx_settings})"

    def peer_fields(self) -> dict[str, object]:
        return {"nixl_metadata": self._metadata}

    async def read(
        self,
        peer: PeerInfo,
        remote_ids: Sequence[int],
        local_ids: Sequence[int],
        request_id: str,
        deadline: Deadline,
    ) -> int:
        local = np.asarray(local_ids, dtype=np.int32)
        remote = np.asarray(remote_ids, dtype=np.int32)
        message = release_message(request_id)
        used: list[_Peer] = []

        def make_handle() -> Any:
            conn = self._connection(peer)
            try:
                handle = self._driver.agent.make_prepped_xfer(
                    "READ", self._local, local, conn.dlist, remote, message
                )
            except Exception:
                self._retire(conn)
                raise
            conn.inflight += 1
            used.append(conn)
            return handle

        def on_finish(error: TransferError | None) -> None:
            conn = used[0]
            conn.inflight -= 1
            if error is not None and not isinstance(error, TransferCancelled):
                self._retire(conn)  # reconnect from scratch next time
            self._reap(conn)

        future = self._driver.transfer(make_handle, deadline, on_finish)
        try:
            await asyncio.wait_for(
                asyncio.wrap_future(future), max(deadline.left(), 0.0) + _STUCK_GRACE_S
            )
        except asyncio.CancelledError:
            await asyncio.shield(asyncio.wrap_future(self._driver.cancel(future)))
            raise
        except TimeoutError:
            self._driver.cancel(future)
            logger.error("NIXL driver thread did not answer within the deadline")
            raise TransferTimeout("transfer exceeded its deadline (driver stalled)") from None
        return len(local_ids) * self._region.block_bytes

    def _connection(self, peer: PeerInfo) -> _Peer:
        """The cached connection to this owner process, made on first use (driver thread)."""
        conn = self._peers.get(peer.agent_name)
        if conn is not None and not conn.retired:
            return conn
        if conn is not None:
            raise PeerUnavailable(f"peer {peer.agent_name} failed and still has transfers")
        for other in list(self._peers.values()):
            if other.info.node_name == peer.node_name:
                logger.info("peer %s restarted as %s", other.info.agent_name, peer.agent_name)
                self._retire(other)
        agent = self._driver.agent
        try:
            loaded = agent.add_remote_agent(peer.nixl_metadata)
        except Exception as exc:
            raise PeerUnavailable(f"NIXL refused the metadata of {peer.agent_name}: {exc}") from exc
        name = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        if name != peer.agent_name:
            agent.remove_remote_agent(name)
            raise PeerUnavailable(f"metadata of {name} published as {peer.agent_name}")
        descs = block_descriptors(
            peer.base_address, peer.block_bytes, peer.num_blocks, peer.device_id
        )
        conn = _Peer(peer, agent.prep_xfer_dlist(name, descs, peer.mem_type))
        self._peers[name] = conn
        return conn

    def _retire(self, conn: _Peer) -> None:
        conn.retired = True
        self._reap(conn)

    def _reap(self, conn: _Peer) -> None:
        if not conn.retired or conn.inflight > 0:
            return
        name = conn.info.agent_name
        if self._peers.get(name) is conn:
            del self._peers[name]
        try:
            conn.dlist.release()
            self._driver.agent.remove_remote_agent(name)
        except Exception:
            logger.exception("NIXL could not drop peer %s", name)

    def _on_notif(self, sender: str, message: bytes) -> None:
        request_id = parse_release(message)
        if request_id is None:
            logger.warning("unexpected NIXL notification from %s", sender)
        else:
            self._releases.append(request_id)

    def take_releases(self) -> list[str]:
        out = []
        while self._releases:
            out.append(self._releases.popleft())
        return out

    def forget(self, node_name: str) -> None:
        def drop() -> None:
            for conn in list(self._peers.values()):
                if conn.info.node_name == node_name:
                    self._retire(conn)

        self._driver.call(drop)

    def inflight(self) -> int:
        return self._driver.inflight()

    def close(self) -> None:
        def release() -> None:
            for conn in list(self._peers.values()):
                self._retire(conn)
            self._local.release()

        try:
            self._driver.call(release)
        finally:
            self._driver.stop()
