"""KVTransferAgent: a node's endpoint for moving KV blocks, whichever transport carries them.

agent = KVTransferAgent(kv, fingerprint=layout.fingerprint(), layout=layout.describe(),
                        config=TransferConfig(node_name="prefill-0"), leases=leases)
publish(agent.info.to_json())                    # owner: through Redis / HTTP
result = await agent.read_blocks(peer, remote_ids, local_ids, request_id="r1")  # reader
asyncio.create_task(agent.serve())               # owner: releases and lease expiry
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence

import torch

from kv_transfer.config import TransferConfig
from kv_transfer.deadline import Deadline
from kv_transfer.errors import LayoutMismatch, TransferError, TransferTimeout, TransportUnavailable
from kv_transfer.head_plan import HeadPlan, is_identity, plan_kv, sizes_text
from kv_transfer.hugepages import use_hugepages
from kv_transfer.lease import LeaseTable
from kv_transfer.peer_info import Identity, PeerInfo, TransportKind, stated_protocol
from kv_transfer.rank_agent import RankAgent, RankAgentSetup
from kv_transfer.rank_server import RankListener
from kv_transfer.region import KVRegion, check_block_ids
from kv_transfer.shards import KVShards
from kv_transfer.tcp_heads import local_shards
from kv_transfer.tcp_transport import TcpTransport
from kv_transfer.transport import ReadWindow, TransferCounters, TransferResult, Transport
from kv_transfer.version import PROTOCOL_VERSION

logger = logging.getLogger(__name__)


class KVTransferAgent:
    """Registers one node's KV tensor and moves given blocks to and from peers.

    Owner role: publishes `info`; readers' release notices end leases in `leases`
    (drained by `poll` / `serve`). Reader role: `read_blocks`. A node may play both.
    """

    def __init__(
        self,
        kv: torch.Tensor,
        *,
        fingerprint: str,
        layout: str,
        config: TransferConfig,
        leases: LeaseTable | None = None,
        shards: KVShards | None = None,
    ) -> None:
        """`shards`: a tensor-parallel node's per-rank KV tensors (rank 0's is `kv`); a
        peer that splits the heads otherwise is read head range by head range."""
        self.region = KVRegion(kv)
        self.shards = shards
        if config.hugepages:
            use_hugepages(kv)
        self.config = config
        self.leases = leases
        self.identity = Identity(
            config.node_name, uuid.uuid4().hex[:12], fingerprint, layout, token=config.token
        )
        self.transport: Transport = _select_transport(self.region, self.identity, config, shards)
        weakref.finalize(self, self.transport.close)  # at the latest at interpreter exit
        self.counters: TransferCounters = self.transport.counters
        self.info = PeerInfo(
            node_name=config.node_name,
            incarnation=self.identity.incarnation,
            transport=self.transport.kind,
            fingerprint=fingerprint,
            layout=layout,
            num_blocks=self.region.num_blocks,
            block_bytes=self.region.block_bytes,
            mem_type=self.region.mem_type,
            device_id=self.region.device_id,
            base_address=self.region.base_address,
            num_kv_heads=shards.num_kv_heads if shards is not None else 0,
            shards=shards.rank_shards() if shards is not None and shards.size > 1 else (),
            protocol=stated_protocol(PROTOCOL_VERSION),
            **self.transport.peer_fields(),  # type: ignore[arg-type]
        )

    async def read_blocks(
        self,
        peer: PeerInfo,
        remote_block_ids: Sequence[int],
        local_block_ids: Sequence[int],
        *,
        request_id: str,
        deadline_s: float | None = None,
        trace: Mapping[str, str] | None = None,
    ) -> TransferResult:
        """Copy `peer`'s blocks `remote_block_ids` into this node's `local_block_ids` (pairwise,
        in order), then tell the owner that `request_id` is done with them. `trace`: the
        W3C trace context of the caller's transfer span, sent along over TCP.

        Raises ValueError for bad ids, LayoutMismatch, PeerUnavailable, TransferTimeout (after
        `deadline_s`, default `config.deadline_s`) or another TransferError. Once it raises,
        nothing writes into the local blocks any more.
        """
        self._check(peer, remote_block_ids, local_block_ids, request_id)
        deadline = Deadline.after(self.config.deadline_s if deadline_s is None else deadline_s)
        start = time.perf_counter()
        plan = self._head_plan(peer)
        window = ReadWindow(trace)
        window.start()
        try:
            if plan is None:
                nbytes = await self.transport.read(
                    peer, remote_block_ids, local_block_ids, request_id, deadline, window
                )
            else:
                ids = (remote_block_ids, local_block_ids)
                nbytes = await self._read_heads(peer, plan, ids, request_id, deadline, window)
        except TransferError as exc:
            self._count_failure(exc, peer)
            raise
        window.end()
        self.counters.ok += 1
        self.counters.bytes += nbytes
        seconds = time.perf_counter() - start
        facts = {**window.facts, "splitserve.wire_ms": window.wire_seconds() * 1e3}
        return TransferResult(
            nbytes, seconds, window.seconds(), window.pieces, window.retries, facts
        )

    def rank_listeners(self) -> list[RankListener]:
        """What ranks 1..N-1 need to serve their own KV shard over TCP from their own
        processes (``rank_server.serve_rank_kv``); [] unless this is a multi-rank node on
        the TCP transport."""
        if self.shards is None or self.transport.kind is not TransportKind.TCP:
            return []
        shards, config = self.shards, self.config
        return [
            RankListener(
                self.identity,
                config.tcp_host,
                config.dial_host,
                shards.spans[rank],
                shards.layers[rank],
                shards.num_kv_heads,
            )
            for rank in range(1, shards.size)
        ]

    def use_rank_listeners(self, endpoints: Sequence[tuple[str, int]]) -> None:
        """Advertise ranks 1..N-1's own listeners (host, port) in ``info``, before it is
        published: readers then read each rank's cells from the rank itself."""
        shards = list(self.info.shards)
        if len(endpoints) != len(shards) - 1:
            raise ValueError(f"{len(endpoints)} listeners for {len(shards) - 1} ranks")
        for rank, (host, port) in enumerate(endpoints, start=1):
            shards[rank] = dataclasses.replace(shards[rank], tcp_host=host, tcp_port=port)
        self.info = dataclasses.replace(self.info, shards=tuple(shards))

    def rank_agents(self) -> list[RankAgentSetup]:
        """What ranks 1..N-1 need to serve their own KV shard with their own NIXL agents
        from their own processes (``rank_agent.serve_rank_nixl``); [] unless this is a
        multi-rank node on the NIXL transport."""
        if self.shards is None or self.transport.kind is not TransportKind.NIXL:
            return []
        config = self.config
        setup = RankAgentSetup(
            self.identity.agent_name, config.ucx_tls, config.progress_wakeup_us,
            config.poll_interval_s,
        )  # fmt: skip
        return [setup] * (self.shards.size - 1)

    def use_rank_agents(self, agents: Sequence[RankAgent]) -> None:
        """Advertise ranks 1..N-1's own NIXL agents in ``info``, before it is published:
        readers then read each rank's cells from the rank's agent."""
        shards = list(self.info.shards)
        if len(agents) != len(shards) - 1:
            raise ValueError(f"{len(agents)} NIXL agents for {len(shards) - 1} ranks")
        for rank, (meta, address) in enumerate(agents, start=1):
            shards[rank] = dataclasses.replace(
                shards[rank], nixl_metadata=meta, agent_base_address=address
            )
        self.info = dataclasses.replace(self.info, shards=tuple(shards))

    def _head_plan(self, peer: PeerInfo) -> HeadPlan | None:
        """The layer and head ranges to move when the two nodes split the KV differently;
        None when whole blocks move (one rank each side). LayoutMismatch names both sides'
        tensor- and pipeline-parallel sizes when the ranks cannot be mapped."""
        if self.shards is None and not peer.shards:
            return None
        local = local_shards(self.region.kv, self.shards)
        heads, layers = local.num_kv_heads, local.num_layers
        mine = local.parts
        theirs = peer.parts(heads, layers)
        try:
            if peer.num_kv_heads and peer.num_kv_heads != heads:
                raise ValueError(f"{peer.num_kv_heads} KV heads there, {heads} here")
            stop = max(p.layers.stop for p in theirs)
            if stop != layers:
                raise ValueError(f"{stop} layers there, {layers} here")
            plan = plan_kv(theirs, mine, layers, heads)
        except ValueError as exc:
            raise LayoutMismatch(
                f"{self.info.layout} {sizes_text(mine)}",
                f"{peer.layout} {sizes_text(theirs)} ({exc})",
                peer.agent_name,
            ) from None
        return None if local.size == 1 and is_identity(plan, theirs, mine) else plan

    async def _read_heads(
        self,
        peer: PeerInfo,
        plan: HeadPlan,
        ids: tuple[Sequence[int], Sequence[int]],
        request_id: str,
        deadline: Deadline,
        window: ReadWindow,
    ) -> int:
        local = local_shards(self.region.kv, self.shards)
        nbytes = await self.transport.read_heads(
            peer, plan, local, ids, request_id, deadline, window
        )
        for copy in plan.copies:  # replicated heads: moved once, copied here
            local.copy(copy, ids[1])
        local.synchronize()
        return nbytes

    async def release(
        self, peer: PeerInfo, request_id: str, *, deadline_s: float | None = None
    ) -> None:
        """Tell the owner that `request_id` is done with its blocks without reading any (this
        node had them all cached): it ends the lease like a completed READ. Raises like
        `read_blocks`; a notice that never arrives leaves the lease to its expiry."""
        self._check_peer(peer)
        if not request_id:
            raise ValueError("request_id must be a non-empty string")
        deadline = Deadline.after(self.config.deadline_s if deadline_s is None else deadline_s)
        await self.transport.release(peer, request_id, deadline)

    async def connect(self, peer: PeerInfo, *, deadline_s: float | None = None) -> None:
        """Set up the connection to `peer` ahead of the first READ (which otherwise pays for it:
        tens of ms). Optional; raises like `read_blocks`."""
        self._check_peer(peer)
        deadline = Deadline.after(self.config.deadline_s if deadline_s is None else deadline_s)
        await self.transport.connect(peer, deadline)

    def poll(self) -> int:
        """Owner: end the leases that readers released and those past expiry; returns how many."""
        released = self.transport.take_releases()
        if self.leases is None:
            return 0
        ended = sum(self.leases.release(request_id) for request_id in released)
        return ended + len(self.leases.expire())

    async def serve(self) -> None:
        """Owner: run `poll` every `config.poll_interval_s` until cancelled."""
        while True:
            self.poll()
            await asyncio.sleep(self.config.poll_interval_s)

    def forget_peer(self, node_name: str) -> None:
        """Drop cached connections to `node_name` (e.g. when the registry says it left)."""
        self.transport.forget(node_name)

    def close(self) -> None:
        """Stop serving and reading; idempotent."""
        self.transport.close()

    def _check(
        self, peer: PeerInfo, remote: Sequence[int], local: Sequence[int], request_id: str
    ) -> None:
        self._check_peer(peer)
        if not request_id:
            raise ValueError("request_id must be a non-empty string")
        if len(remote) != len(local):
            raise ValueError(
                f"remote_block_ids has {len(remote)} ids but local_block_ids has {len(local)}"
            )
        check_block_ids(remote, peer.num_blocks, "remote_block_ids", unique=False)
        self.region.check_ids(local, "local_block_ids", unique=True)

    def _check_peer(self, peer: PeerInfo) -> None:
        sharded = self.shards is not None or bool(peer.shards)
        if peer.fingerprint != self.info.fingerprint or (
            not sharded and peer.block_bytes != self.region.block_bytes
        ):
            raise LayoutMismatch(self.info.layout, peer.layout, peer.agent_name)
        if peer.transport is not self.transport.kind:
            raise TransferError(
                f"peer {peer.agent_name} speaks {peer.transport.value}, "
                f"this node {self.transport.kind.value}"
            )

    def _count_failure(self, exc: TransferError, peer: PeerInfo) -> None:
        self.counters.failed += 1
        if isinstance(exc, TransferTimeout):
            self.counters.timed_out += 1
        logger.warning("READ from %s failed: %s", peer.agent_name, exc)


def _select_transport(
    region: KVRegion, identity: Identity, config: TransferConfig, shards: KVShards | None
) -> Transport:
    transport: Transport
    if config.transport == "tcp":
        transport = TcpTransport(region, identity, config, shards)
    else:
        try:
            from kv_transfer.nixl_transport import NixlTransport

            transport = NixlTransport(region, identity, config, shards)
        except TransportUnavailable as exc:
            if config.transport == "nixl":
                raise
            logger.warning("NIXL unavailable, falling back to TCP: %s", exc)
            transport = TcpTransport(region, identity, config, shards)
    logger.info(
        "kv_transfer agent %s: transport %s; %d blocks of %d bytes (%s)",
        identity.agent_name,
        transport.describe(),
        region.num_blocks,
        region.block_bytes,
        region.mem_type,
    )
    return transport
