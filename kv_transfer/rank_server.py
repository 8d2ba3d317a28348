"""A rank's own TCP listener: a rank of a multi-rank node serves its KV shard from its own
process, so the sending side of a transfer runs on every rank at once (its own threads,
its own socket, its own NIC where it has one) instead of all through rank 0's.

Rank 0's agent hands each rank a ``RankListener`` (``KVTransferAgent.rank_listeners``); the
rank's process calls ``serve_rank_kv`` on its own KV tensor (``engine.parallel``'s
``RankGroup.call_on_ranks`` runs it there) and the answer, the listener's address, goes
into the node's PeerInfo (``KVTransferAgent.use_rank_listeners``). Readers dial it for the
pieces the rank holds (``tcp_heads.RankRead``); the HELLO is checked against the node's
identity, so a restarted node's ranks refuse readers of the old one. Releases still go to
rank 0's block server, which holds the leases.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from kv_transfer.head_plan import HeadSpan, LayerSpan
from kv_transfer.peer_info import Identity
from kv_transfer.region import KVRegion
from kv_transfer.shards import KVShards
from kv_transfer.tcp_server import BlockServer

logger = logging.getLogger(__name__)

_SERVERS: list[BlockServer] = []  # a rank's listeners live as long as its process


@dataclass(frozen=True)
class RankListener:
    """What a rank's process needs to serve its cells: the node's identity (checked in each
    reader's HELLO), where to listen and the address readers dial, and the model's layers
    and KV heads its tensor holds."""

    identity: Identity
    host: str
    advertise_host: str
    heads: HeadSpan
    layers: LayerSpan
    num_kv_heads: int


def serve_rank_kv(kv: torch.Tensor, rank: int, setup: RankListener) -> tuple[str, int]:
    """Serve ``kv`` (rank ``rank``'s KV tensor, in its own process) on a new listener until
    the process exits; its (host, port) for the node's PeerInfo."""
    shards = KVShards([kv], [setup.heads], setup.num_kv_heads, [setup.layers])
    server = BlockServer(
        KVRegion(kv), setup.identity, setup.host, 0, _stray_release, shards, first_rank=rank
    )
    _SERVERS.append(server)
    logger.info("rank %d serves its KV on %s:%d", rank, setup.advertise_host, server.port)
    return setup.advertise_host, server.port


def close_rank_servers() -> None:
    """Stop this process's rank listeners (tests; a rank's process just exits)."""
    while _SERVERS:
        _SERVERS.pop().close()


def _stray_release(request_id: str) -> None:
    logger.debug("release of %s sent to a rank listener ignored", request_id)
