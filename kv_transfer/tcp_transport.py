"""The TCP fallback transport: the NIXL interface over plain sockets.

Owner side: a BlockServer (tcp_server.py) serves the registered blocks from threads. Reader
side: each READ is a BlockRead (tcp_client.py) on a small thread pool, awaited here; a READ
between nodes that split the KV differently is one RankRead per (sending rank, receiving
rank) pair (tcp_heads.py), all on the pool at once, each on its own connection.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures as cf
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence

from kv_transfer.config import TransferConfig
from kv_transfer.deadline import Deadline
from kv_transfer.errors import TransferCancelled, TransferError, TransferTimeout
from kv_transfer.head_plan import HeadPlan
from kv_transfer.peer_info import Identity, PeerInfo, TransportKind
from kv_transfer.region import KVRegion
from kv_transfer.shards import KVShards
from kv_transfer.tcp_client import BlockRead, ConnectionPool
from kv_transfer.tcp_heads import RankRead, rank_spans
from kv_transfer.tcp_server import BlockServer
from kv_transfer.transport import ReadWindow, ServedHook, TransferCounters, settle

logger = logging.getLogger(__name__)

_READ_THREADS = 16  # concurrent READs x sending ranks
_STUCK_GRACE_S = 2.0  # beyond the deadline, stop waiting for a reader thread that hangs


class TcpTransport:
    kind = TransportKind.TCP

    def __init__(
        self,
        region: KVRegion,
        identity: Identity,
        config: TransferConfig,
        shards: KVShards | None = None,
    ) -> None:
        self._region = region
        self._identity = identity
        self._host = config.dial_host
        self._releases: collections.deque[str] = collections.deque()
        self._server = BlockServer(
            region, identity, config.tcp_host, config.tcp_port, self._releases.append, shards
        )
        self._pool = ConnectionPool()
        self._executor = cf.ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="kv-tcp-read")
        self.counters = TransferCounters()
        self._inflight = 0
        self.peak_inflight = 0  # the most reader threads (one per sending rank) busy at once
        self._lock = threading.Lock()

    def describe(self) -> str:
        return f"tcp (block server on {self._host}:{self._server.port})"

    def peer_fields(self) -> dict[str, object]:
        return {"tcp_host": self._host, "tcp_port": self._server.port}

    async def read(
        self,
        peer: PeerInfo,
        remote_ids: Sequence[int],
        local_ids: Sequence[int],
        request_id: str,
        deadline: Deadline,
        window: ReadWindow,
    ) -> int:
        ids = (list(remote_ids), list(local_ids))
        job = BlockRead(self._pool, self._region, self._identity, peer, ids, request_id, deadline)
        job.window = window
        await self._run(job, deadline)
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
        pair = (list(ids[0]), list(ids[1]))
        args = (self._pool, self._region, self._identity, peer, pair, request_id, deadline)
        pairs = rank_spans(plan).items()
        jobs = [RankRead(local, src, spans, *args) for (src, _), spans in pairs]
        for job in jobs:
            job.window = window
        await self._run_all(jobs, deadline)
        notice = BlockRead(*args[:4], ([], []), request_id, deadline)
        self._executor.submit(self._release_after, notice)  # off the caller's path
        return sum(job.nbytes() for job in jobs)

    async def _run_all(self, jobs: list[RankRead], deadline: Deadline) -> None:
        """Run every sending rank's READ at once, each on a reader thread, within the
        deadline. The first failure aborts the others; once this raises, none writes into
        the local blocks any more (bounded by a grace for a thread that hangs)."""
        futures = [asyncio.wrap_future(self._executor.submit(self._counted, j)) for j in jobs]
        for future in futures:  # one may end past the grace, unawaited: its error is seen here
            future.add_done_callback(_retrieved)
        wait_s = max(deadline.left(), 0.0) + _STUCK_GRACE_S
        try:
            first, pending = await asyncio.wait(
                futures, timeout=wait_s, return_when=asyncio.FIRST_EXCEPTION
            )
        except asyncio.CancelledError:
            for job in jobs:
                job.abort()
            await asyncio.wait(futures)
            raise
        if pending:
            for job in jobs:
                job.abort()
            await asyncio.wait(pending, timeout=_STUCK_GRACE_S)
        # the failures that ended the wait first, then those of the READs it aborted
        finished = [f for f in futures if f in first] + [f for f in futures if f in pending]
        errors = [e for f in finished if f.done() and (e := f.exception()) is not None]
        real = [e for e in errors if not isinstance(e, TransferCancelled)] or errors
        if real:
            raise real[0]
        if pending:
            raise TransferTimeout("transfer exceeded its deadline (reader thread stalled)")

    async def _run(self, job: BlockRead, deadline: Deadline) -> None:
        """Run a READ on a reader thread within the deadline; abort it on cancellation. It
        returns as soon as the blocks are in: the thread sends the RELEASE after."""
        loop = asyncio.get_running_loop()
        delivered: asyncio.Future[None] = loop.create_future()

        def on_data() -> None:  # reader thread
            loop.call_soon_threadsafe(settle, delivered, None)

        job.on_data = on_data
        ended = asyncio.wrap_future(self._executor.submit(self._counted, job))
        ended.add_done_callback(lambda f: _settle_from(delivered, f))
        try:
            async with asyncio.timeout(max(deadline.left(), 0.0) + _STUCK_GRACE_S):
                await delivered
        except asyncio.CancelledError:
            job.abort()
            await asyncio.wait([ended])  # the thread stops writing into local blocks first
            raise
        except TimeoutError:
            job.abort()
            raise TransferTimeout(
                "transfer exceeded its deadline (reader thread stalled)"
            ) from None

    async def release(self, peer: PeerInfo, request_id: str, deadline: Deadline) -> None:
        job = BlockRead(
            self._pool, self._region, self._identity, peer, ([], []), request_id, deadline
        )
        await self._finish(job, job.release_only, deadline)

    async def connect(self, peer: PeerInfo, deadline: Deadline) -> None:
        job = BlockRead(self._pool, self._region, self._identity, peer, ([], []), "", deadline)
        await self._finish(job, job.connect_only, deadline)

    async def _finish(self, job: BlockRead, step: Callable[[], None], deadline: Deadline) -> None:
        """Run a short socket step of `job` on a reader thread, within the deadline."""
        future = asyncio.wrap_future(self._executor.submit(step))
        try:
            await asyncio.wait_for(asyncio.shield(future), max(deadline.left(), 0) + _STUCK_GRACE_S)
        except asyncio.CancelledError:
            job.abort()
            raise
        except TimeoutError:
            job.abort()
            raise TransferTimeout(f"talking to {job.peer.agent_name} timed out") from None

    def _counted(self, job: BlockRead) -> None:
        with self._counting():
            job.run()
        if job.release_failed:
            self._count_release_failure()

    def _release_after(self, job: BlockRead) -> None:
        """Send a completed READ's release notice (reader thread); a failure is logged and
        counted: the owner's lease then ends at its expiry."""
        try:
            job.release_only()
        except TransferError as exc:
            logger.warning("release notice to %s failed: %s", job.peer.agent_name, exc)
            self._count_release_failure()

    def _count_release_failure(self) -> None:
        with self._lock:
            self.counters.release_failed += 1

    @contextlib.contextmanager
    def _counting(self) -> Iterator[None]:
        with self._lock:
            self._inflight += 1
            self.peak_inflight = max(self.peak_inflight, self._inflight)
        try:
            yield
        finally:
            with self._lock:
                self._inflight -= 1

    def take_releases(self) -> list[str]:
        out = []
        while self._releases:
            out.append(self._releases.popleft())
        return out

    def on_served(self, hook: ServedHook) -> None:
        self._server.on_served = hook

    def forget(self, node_name: str) -> None:
        self._pool.forget(node_name)

    def inflight(self) -> int:
        with self._lock:
            return self._inflight

    def close(self) -> None:
        self._server.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._pool.close()


def _settle_from(delivered: asyncio.Future[None], ended: asyncio.Future[None]) -> None:
    """A reader thread ended: fail or cancel the caller's wait unless its blocks came."""
    if ended.cancelled():  # the pool shut down before the READ started
        delivered.cancel()
        return
    error = ended.exception()
    if error is not None and delivered.done():
        logger.error("reader thread failed after its READ completed: %r", error)
    settle(delivered, error)


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark a READ's outcome as seen: `_run_all` reads the errors it waits for, and one that
    ends after it gave up (aborted) needs no handling, nor asyncio's "never retrieved" log."""
    if not future.cancelled():
        future.exception()
