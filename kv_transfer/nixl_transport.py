"""The NIXL transport: one-sided READs of registered blocks over UCX.

The reader loads the owner's agent metadata once per owner process (lazily, cached by agent
name, which embeds the owner's incarnation) and prepares the owner's block list once; each
READ is then one `make_prepped_xfer` over block indices. When a READ completes, the reader
sends the release notice (a NIXL notification carrying the request id) to the owner, whose
driver thread queues it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kv_transfer.config import TransferConfig
from kv_transfer.deadline import Deadline
from kv_transfer.errors import (
    TransferCancelled,
    TransferError,
    TransferTimeout,
    TransportUnavailable,
)
from kv_transfer.head_plan import HeadPlan, Piece
from kv_transfer.nixl_driver import NixlDriver, as_transfer_error
from kv_transfer.nixl_loader import apply_ucx_settings, create_agent, load_nixl
from kv_transfer.nixl_peers import NixlPeer, NixlPeers
from kv_transfer.nixl_report import PREFIX, merged, read_report
from kv_transfer.nixl_waits import all_or_none, named
from kv_transfer.peer_info import Identity, PeerInfo, TransportKind
from kv_transfer.region import KVRegion
from kv_transfer.shards import KVShards, read_descriptors
from kv_transfer.transport import (
    ReadWindow,
    ServedHook,
    TransferCounters,
    parse_release,
    release_message,
)

logger = logging.getLogger(__name__)

READER_SUFFIX = ".reader"
_STUCK_GRACE_S = 2.0  # beyond the deadline, stop waiting for a driver that does not answer


class NixlTransport:
    """Two NIXL agents share the registered tensor: a serving agent (progress thread: answers
    connection setup and receives release notices at once; its metadata is published) and a
    reading agent (no progress thread: the driver progresses its READs, so no second thread
    contends for its UCX worker during a copy, which halved CMA bandwidth when measured)."""

    kind = TransportKind.NIXL

    def __init__(
        self,
        region: KVRegion,
        identity: Identity,
        config: TransferConfig,
        shards: KVShards | None = None,
    ) -> None:
        self.ucx_settings = apply_ucx_settings(config.ucx_tls)
        self._ucx_tls = os.environ.get("UCX_TLS") or "unset"  # in force when agents start
        api = load_nixl()
        self._region = region
        # every rank's tensor is registered: a head READ reads into and from any of them
        self._tensors = shards.tensors if shards is not None else [region.kv]
        self._releases: collections.deque[str] = collections.deque()
        self.counters = TransferCounters()
        self._peers = NixlPeers()  # touched on the driver thread only
        self._reading: Any = None
        self._local: Any = None
        self._driver = NixlDriver(identity.agent_name, config.poll_interval_s)
        name, wakeup_us = identity.agent_name, config.progress_wakeup_us
        try:
            self._metadata = self._driver.call(lambda: self._setup_serving(api, name, wakeup_us))
        except BaseException:
            self._driver.stop()
            raise
        # Ready long before the first READ, whose job queues behind this one.
        self._reading_ready = self._driver.submit(
            lambda: self._setup_reading(api, name + READER_SUFFIX)
        )

    def _setup_serving(self, api: Any, name: str, wakeup_us: int) -> bytes:
        agent = create_agent(api, name, progress_wakeup_us=wakeup_us)
        for tensor in self._tensors:
            agent.register_memory(tensor)
        self._driver.watch_notifs(agent, self._on_notif)
        return bytes(agent.get_agent_metadata())

    def _setup_reading(self, api: Any, name: str) -> None:
        agent = create_agent(api, name, progress_wakeup_us=None, telemetry=True)
        for tensor in self._tensors:
            agent.register_memory(tensor)
        self._local = agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", self._region.descriptors(), self._region.mem_type
        )
        self._driver.watch_notifs(agent, self._on_stray_notif)  # progresses sent notices
        self._peers.agent = self._reading = agent

    def _reading_agent(self) -> Any:
        """The reading agent (driver thread); TransportUnavailable if it failed to start."""
        if self._reading is None:
            error = self._reading_ready.exception(timeout=0)
            raise TransportUnavailable(f"NIXL reading agent failed to start: {error}")
        return self._reading

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
        window: ReadWindow,
    ) -> int:
        local = np.asarray(local_ids, dtype=np.int32)
        remote = np.asarray(remote_ids, dtype=np.int32)

        def make(agent: Any, conn: NixlPeer) -> Any:
            return agent.make_prepped_xfer("READ", self._local, local, conn.dlist, remote)

        message = release_message(request_id)
        await self._read(lambda: self._peers.node(peer), make, deadline, window, release=message)
        return len(local_ids) * self._region.block_bytes

    async def read_heads(
        self,
        peer: PeerInfo,
        plan: HeadPlan,
        local: KVShards,
        ids: tuple[Sequence[int], Sequence[int]],
        request_id: str,
        deadline: Deadline,
        window: ReadWindow,
    ) -> int:
        """One transfer per remote agent, all posted at once: a sending rank's pieces from
        its own agent where it runs one (``rank_agent``), the rest from the node's. Each
        piece is up to ``layers * 2 * block_size`` descriptors per block (fewer where runs
        follow each other on both sides), straight from the sending rank's memory into the
        local rank's. The release notice goes to the node's agent after the last."""
        remote_shards = peer.agent_shards(local.num_kv_heads, local.num_layers)
        groups: dict[str, list[Piece]] = {}
        for piece in plan.reads:
            groups.setdefault(peer.rank_agent(piece.src)[0], []).append(piece)
        jobs = []
        for pieces in groups.values():
            rows = [read_descriptors(local, remote_shards, p, ids[0], ids[1]) for p in pieces]
            ranks = sorted({p.src for p in pieces})
            jobs.append(self._read_pieces(peer, ranks, rows, deadline, window))
        await all_or_none(jobs)
        message = release_message(request_id)
        self._driver.submit(lambda: self._notify(self._peers.node(peer), message))
        return local.plan_bytes(plan, len(ids[1]))

    async def _read_pieces(
        self,
        peer: PeerInfo,
        ranks: list[int],
        rows: list[tuple[np.ndarray, np.ndarray]],
        deadline: Deadline,
        window: ReadWindow,
    ) -> None:
        """One transfer of ``rows`` (local, remote descriptors) from the agent that serves
        sending ranks ``ranks``; its failure names them."""
        mine = np.concatenate([r[0] for r in rows])
        theirs = np.concatenate([r[1] for r in rows])

        def make(agent: Any, conn: NixlPeer) -> Any:
            local_descs = agent.get_xfer_descs(mine, self._region.mem_type)
            remote_descs = agent.get_xfer_descs(theirs, peer.mem_type)
            return agent.initialize_xfer("READ", local_descs, remote_descs, conn.name)

        label = ""
        if peer.shards:
            label = f"{peer.agent_name} (sending rank{'s' if len(ranks) > 1 else ''} "
            label += ", ".join(map(str, ranks)) + ")"
        rank = ranks[0]
        await self._read(lambda: self._peers.rank(peer, rank), make, deadline, window, label)

    async def _read(
        self,
        connect: Callable[[], NixlPeer],
        make: Callable[[Any, NixlPeer], Any],
        deadline: Deadline,
        window: ReadWindow,
        label: str = "",
        release: bytes | None = None,
    ) -> None:
        """Post the transfer ``make`` creates on the connection ``connect`` gives (both on
        the driver thread) and wait for it, noting in ``window`` the connection set-up, the
        post and the completion (as the driver sees it). Once it completes, the caller goes
        on; ``release`` then goes to that agent. A failure is a TransferError that starts
        with ``label``."""
        used: list[NixlPeer] = []

        def make_handle() -> tuple[Any, Any]:
            agent = self._reading_agent()
            began = time.perf_counter()
            conn = connect()  # loads the peer's metadata on first use
            window.setup(time.perf_counter() - began)
            try:
                handle = make(agent, conn)
            except Exception:
                self._peers.retire(conn)
                raise
            conn.inflight += 1
            used.append(conn)
            window.post()  # the driver posts it next
            return agent, handle

        def on_done(agent: Any, handle: Any) -> None:
            window.complete()
            if window.traced:  # NIXL's telemetry is for the span; untraced, skip its cost
                self._note_report(window, agent, handle)

        def on_finish(error: TransferError | None) -> None:
            conn = used[0]
            conn.inflight -= 1
            if error is None and release is not None:
                self._notify(conn, release)
            elif error is not None and not isinstance(error, TransferCancelled):
                self._peers.retire(conn)  # reconnect from scratch next time
            self._peers.reap(conn)

        future = self._driver.transfer(make_handle, deadline, on_finish, on_done)
        try:
            async with asyncio.timeout(max(deadline.left(), 0.0) + _STUCK_GRACE_S):
                await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            await asyncio.shield(asyncio.wrap_future(self._driver.cancel(future)))
            raise
        except TimeoutError:
            self._driver.cancel(future)
            logger.error("NIXL driver thread did not answer within the deadline")
            stalled = TransferTimeout("transfer exceeded its deadline (driver stalled)")
            raise named(stalled, label) from None
        except TransferError as exc:
            raise named(exc, label) from exc

    def _note_report(self, window: ReadWindow, agent: Any, handle: Any) -> None:
        report = read_report(agent, handle)
        if report is not None:
            facts = merged(window.facts, report)
            facts[PREFIX + "ucx_tls"] = self._ucx_tls
            window.note(facts)

    async def release(self, peer: PeerInfo, request_id: str, deadline: Deadline) -> None:
        def notify() -> None:
            self._reading_agent()
            self._notify(self._peers.node(peer), release_message(request_id))

        await self._on_driver(notify, peer, deadline)

    async def connect(self, peer: PeerInfo, deadline: Deadline) -> None:
        def setup() -> None:
            agent = self._reading_agent()
            names = {self._peers.node(peer).name}
            names.update(self._peers.rank(peer, r).name for r in range(len(peer.shards)))
            for name in sorted(names):
                agent.make_connection(name)  # wireup completes as the driver progresses

        await self._on_driver(setup, peer, deadline)

    async def _on_driver(
        self, step: Callable[[], None], peer: PeerInfo, deadline: Deadline
    ) -> None:
        """Run a short step on the driver thread within the deadline."""
        future = self._driver.submit(step)
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), max(deadline.left(), 0.0))
        except TimeoutError:
            raise TransferTimeout(f"the NIXL step towards {peer.agent_name} timed out") from None
        except TransferError:
            raise
        except Exception as exc:
            raise as_transfer_error(exc) from exc

    def _notify(self, conn: NixlPeer, message: bytes) -> None:
        """Tell the owner the READ is done. Sent after completion rather than attached to the
        transfer, so the READ does not wait for the owner to acknowledge it; a lost notice
        only delays the release until the lease expires (counted)."""
        try:
            self._reading.send_notif(conn.name, message)
        except Exception as exc:
            self.counters.release_failed += 1
            logger.warning("release notice to %s failed: %s", conn.name, exc)

    def _on_notif(self, sender: str, message: bytes) -> None:
        request_id = parse_release(message)
        if request_id is None:
            logger.warning("unexpected NIXL notification from %s", sender)
        else:
            self._releases.append(request_id)

    def _on_stray_notif(self, sender: str, message: bytes) -> None:
        logger.debug("notification to the reading agent from %s ignored", sender)

    def take_releases(self) -> list[str]:
        out = []
        while self._releases:
            out.append(self._releases.popleft())
        return out

    def on_served(self, hook: ServedHook) -> None:
        """Nothing to report: a NIXL READ is one-sided (the reader's NIC pulls the blocks),
        so this side never sees it start or end; only the release notice comes after."""

    def forget(self, node_name: str) -> None:
        self._driver.submit(lambda: self._peers.forget(node_name))

    def inflight(self) -> int:
        """Blocks until the driver thread answers (for tests and diagnostics)."""
        return self._driver.inflight()

    def close(self) -> None:
        """Drop peers and destroy both agents on the driver thread (their destructors stop
        UCX's threads; left to interpreter exit, that can abort the process). Idempotent."""

        def teardown() -> None:
            if self._reading is not None:
                self._peers.close()
            if self._local is not None:
                self._local.release()
            self._local = self._reading = self._peers.agent = None
            self._driver.forget_agents()  # the last references: destructors run here

        if self._driver.stopped:
            return
        try:
            self._driver.call(teardown)
        finally:
            self._driver.stop()
