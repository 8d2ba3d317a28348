"""The remote NIXL agents a reading agent knows: one per owner process, a node's own agent
(rank 0's) and, on a multi-rank node, each rank's own agent (``rank_agent``). Loaded on
first use, cached by agent name (which embeds the owner's incarnation); touched on the
driver thread only."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kv_transfer.errors import PeerUnavailable
from kv_transfer.peer_info import PeerInfo
from kv_transfer.region import block_descriptors

logger = logging.getLogger(__name__)


@dataclass
class NixlPeer:
    """One remote agent: ``name``, the node it belongs to (``info``), and for a node's own
    agent its prepared block list (whole-block READs)."""

    name: str
    info: PeerInfo
    dlist: Any | None
    inflight: int = 0
    retired: bool = False


class NixlPeers:
    """The cache of remote agents of one reading agent (``agent``, set once it exists)."""

    def __init__(self) -> None:
        self.agent: Any = None
        self._peers: dict[str, NixlPeer] = {}

    def node(self, peer: PeerInfo) -> NixlPeer:
        """The connection to ``peer``'s own agent (rank 0's), with its block list."""
        return self._get(peer, peer.agent_name, peer.nixl_metadata or b"", with_blocks=True)

    def rank(self, peer: PeerInfo, rank: int) -> NixlPeer:
        """The connection to the agent that serves ``peer``'s rank ``rank``."""
        name, metadata = peer.rank_agent(rank)
        if name == peer.agent_name:
            return self.node(peer)
        return self._get(peer, name, metadata, with_blocks=False)

    def _get(self, peer: PeerInfo, name: str, metadata: bytes, *, with_blocks: bool) -> NixlPeer:
        conn = self._peers.get(name)
        if conn is not None and not conn.retired:
            return conn
        if conn is not None:
            raise PeerUnavailable(f"peer {name} failed and still has transfers")
        for other in list(self._peers.values()):
            same_node = other.info.node_name == peer.node_name
            if same_node and other.info.incarnation != peer.incarnation:
                logger.info("peer %s restarted as %s", other.name, name)
                self.retire(other)
        agent = self.agent
        try:
            loaded = agent.add_remote_agent(metadata)
        except Exception as exc:
            raise PeerUnavailable(f"NIXL refused the metadata of {name}: {exc}") from exc
        loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        if loaded != name:
            agent.remove_remote_agent(loaded)
            raise PeerUnavailable(f"metadata of {loaded} published as {name}")
        dlist = None
        if with_blocks:
            descs = block_descriptors(
                peer.base_address, peer.block_bytes, peer.num_blocks, peer.device_id
            )
            try:
                dlist = agent.prep_xfer_dlist(name, descs, peer.mem_type)
            except Exception as exc:
                agent.remove_remote_agent(name)
                raise PeerUnavailable(f"NIXL refused the blocks of {name}: {exc}") from exc
        conn = self._peers[name] = NixlPeer(name, peer, dlist)
        return conn

    def retire(self, conn: NixlPeer) -> None:
        """Drop ``conn`` once its transfers end (reconnect from scratch next time)."""
        conn.retired = True
        self.reap(conn)

    def reap(self, conn: NixlPeer) -> None:
        if not conn.retired or conn.inflight > 0:
            return
        if self._peers.get(conn.name) is conn:
            del self._peers[conn.name]
        try:
            if conn.dlist is not None:
                conn.dlist.release()
            self.agent.remove_remote_agent(conn.name)
        except Exception:
            logger.exception("NIXL could not drop peer %s", conn.name)

    def forget(self, node_name: str) -> None:
        for conn in list(self._peers.values()):
            if conn.info.node_name == node_name:
                self.retire(conn)

    def close(self) -> None:
        for conn in list(self._peers.values()):
            self.retire(conn)
