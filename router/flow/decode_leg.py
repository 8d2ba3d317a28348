"""The decode leg: a decode stream for one request, opened with the prefill's KV handle or
with a local prefill, read token by token, and resumed on another node when one fails.

Once token 1 is out (after a remote prefill, or on a resume) the request must finish: while
every decode node answers busy (batch and import queue full), the leg tries them again after
growing pauses, within the request's deadline. The KV handle goes to a decode node while its
lease has `LEASE_SLACK_S` left; after that the decode node prefills prompt + token 1 itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from typing import NamedTuple

from cluster.node_records import NodeInfo, NodeRecord
from cluster.protocol import PROTOCOL_VERSION, DecodeRequest, KVHandle, TokenEvent, compatible
from router.errors import APIError, overloaded, unavailable
from router.flow.backoff import Backoff
from router.flow.failures import node_failed, refused
from router.flow.lease import KVLease
from router.flow.leg import Leg
from router.flow.request import Deadline, FlowRequest
from router.node_client import NodeCallError
from router.routing.policy import Pools
from router.routing.prefix_index import PrefixQuery
from router.state import RouterState
from router.trail import Trail

log = logging.getLogger("splitserve.router")

LEASE_SLACK_S = 2.0  # what a KV handle's lease must have left when a decode node gets it
# The healthy nodes of a Pools that may take the request.
Candidates = Callable[[Pools], Sequence[NodeRecord]]


def local_nodes(pools: Pools) -> Sequence[NodeRecord]:
    """The nodes that prefill locally: decode and colocated."""
    return pools.local


class _Round(NamedTuple):
    """How one round of tries ended, when no node took the request."""

    busy: int  # nodes that answered busy: worth another round
    failed: int  # nodes that failed: not tried again


class _LeaseEnding(Exception):
    """The KV handle's lease has too little time left to be given to a decode node."""


class DecodeLeg(Leg):
    """At most one open /internal/generate stream at a time. A node that failed or took the
    request (up to `decode_attempts` of them) is not tried again; a busy one is, in the
    next round."""

    def __init__(
        self,
        state: RouterState,
        request: FlowRequest,
        query: PrefixQuery,
        deadline: Deadline,
        lease: KVLease,
        trail: Trail,
    ) -> None:
        super().__init__(state, request, query, deadline, lease, trail)
        self._tried: set[str] = set()
        self._node: NodeInfo | None = None
        self._imported = False  # the stream opened last was given the prefill's KV handle
        self._predicted = 0  # prompt tokens the index expected on that node
        self._recorded = True  # the open stream's prefix hits are counted
        self._stream: AsyncIterator[TokenEvent] | None = None
        self._stream_ctx = AsyncExitStack()

    @property
    def node(self) -> NodeInfo | None:
        """The decode node streaming this request now, if any."""
        return self._node

    @property
    def _retry_after(self) -> int:
        return self._s.settings.retry_after_s

    async def open_with(self, kv: KVHandle, output_ids: list[int]) -> None:
        """After a remote prefill: a decode node of the same KV layout (or one that converts
        it: another kv_cache_dtype) imports the blocks, waiting while they are all busy.
        When there is none, or the lease ends first, release the lease and prefill on a
        decode node instead."""
        pools = Pools.of(self._s.membership.nodes())
        if kv_importers(pools.decode, kv):
            try:
                await self.open(importers_of(kv), kv, output_ids, wait=True)
            except _LeaseEnding:
                reason = "lease_ending"
            else:
                self._lease.taken()
                return
        else:
            reason = _no_importer(pools.decode, kv, self._request.request_id)
        self._s.metrics.local_prefill.labels(reason).inc()
        self._lease.release()
        await self.open(local_nodes, None, output_ids, wait=True)

    async def open(
        self,
        candidates: Candidates,
        kv: KVHandle | None,
        output_ids: list[int],
        *,
        wait: bool = False,
    ) -> None:
        """Start /internal/generate on one of the healthy nodes `candidates` picks. Raises
        APIError when none takes it: 400 for a refused request, 429 when every node tried
        was busy, else 503. With `wait`, a round in which the nodes left were busy is tried
        again after a pause, each time on the nodes then healthy, until the deadline."""
        backoff = Backoff(self._deadline)
        while True:
            nodes = candidates(Pools.of(self._s.membership.nodes()))
            ended = await self._round(nodes, kv, output_ids)
            if ended is None:
                return
            if not (wait and ended.busy):
                raise self._none_took(ended)
            if backoff.pauses == 0:
                log.info("decode_wait id=%s busy_nodes=%d", self._request.request_id, ended.busy)
            self._s.metrics.decode_waits.inc()
            await backoff.pause()

    async def _round(
        self, candidates: Sequence[NodeRecord], kv: KVHandle | None, output_ids: list[int]
    ) -> _Round | None:
        """One try on each of `candidates` not tried before, until one takes the request
        (None then)."""
        state = self._s
        busy: set[str] = set()
        failed = 0
        while len(self._tried) < state.settings.decode_attempts:
            skip = self._tried | busy
            self._route("decode", candidates, skip)
            node = state.picker.pick("decode", candidates, skip, self._query)
            if node is None:
                break
            node_id = node.info.node_id
            left = [c.info.node_id for c in candidates if c.info.node_id not in skip]
            predicted = state.kv.routed(node.info.role, self._query, node_id, left)
            try:
                await self._open_on(node.info, kv, output_ids)
            except NodeCallError as err:
                node_failed(state, self._request.request_id, "decode", err)
                if err.kind == "refused":
                    raise refused(err) from None
                if err.kind == "busy":
                    busy.add(node_id)
                else:
                    self._tried.add(node_id)
                    failed += 1
                continue
            self._tried.add(node_id)
            self._node, self._imported = node.info, kv is not None
            self._predicted, self._recorded = predicted, False
            state.picker.begin(node_id)
            return None
        return _Round(len(busy), failed)

    def _none_took(self, ended: _Round) -> APIError:
        if ended.busy and not ended.failed:
            return overloaded("every decode node is busy", self._retry_after)
        return unavailable("no decode node could take the request", self._retry_after)

    async def _open_on(self, node: NodeInfo, kv: KVHandle | None, output_ids: list[int]) -> None:
        req = DecodeRequest(
            request_id=self._request.request_id,
            prompt_token_ids=self._request.prompt_ids,
            output_token_ids=list(output_ids),
            sampling=self._request.sampling,
            kv=kv,
            priority=self._request.priority,
            wait_s=self._import_wait_s(kv),
            lora=self._request.lora,
            protocol_version=PROTOCOL_VERSION,
        )
        span = self._trail.enter("import" if kv is not None else "decode", node.node_id)
        ctx = self._s.require_nodes().generate(node, req, self._deadline.at, span.headers())
        self._stream = await self._stream_ctx.enter_async_context(ctx)

    def _import_wait_s(self, kv: KVHandle | None) -> float | None:
        """How long the node may queue the import: until the deadline, or until the lease
        has LEASE_SLACK_S left (_LeaseEnding when it has less). None without a handle."""
        if kv is None:
            return None
        lease_left = kv.lease_expires_at - time.time() - LEASE_SLACK_S  # the node's clock
        if lease_left <= 0:
            raise _LeaseEnding
        return min(self._deadline.left_s(), lease_left)

    async def read(self) -> AsyncIterator[TokenEvent]:
        """The open stream's events; the first one's prefix hits go to the KV index."""
        if self._stream is None:
            raise RuntimeError("no decode stream is open")
        async for event in self._stream:
            if not self._recorded and self._node is not None:
                self._recorded = True
                if self._imported:
                    self._trail.enter("decode", self._node.node_id)
                # after an import, the tokens it did not read; else those it did not compute
                hits = event.num_prefix_hit_tokens if self._imported else event.num_cached_tokens
                pool, node_id = self._node.role, self._node.node_id
                self._s.kv.record(pool, node_id, self._predicted, hits)
            yield event

    async def resume(self, err: NodeCallError, output_ids: list[int]) -> None:
        """After the stream failed: recompute prompt + `output_ids` on another decode node,
        or raise a 503."""
        self.end()
        await self.close_stream()
        if self._imported:
            self._lease.release_after_failed_import()
        if len(output_ids) >= self._request.sampling.max_tokens:
            raise unavailable(f"decode failed at the last token: {err}", self._retry_after)
        self._s.metrics.decode_resumes.inc()
        log.warning(
            "decode_resume id=%s tokens_so_far=%d", self._request.request_id, len(output_ids)
        )
        try:
            await self.open(local_nodes, None, output_ids, wait=True)
        except APIError as exc:
            if exc.code == "timeout":  # the deadline passed while every node was busy
                raise
            raise unavailable(
                f"the decode node failed mid-generation and no other took over ({err})",
                self._retry_after,
                code="node_failed",
            ) from None

    def end(self, abort: bool = False) -> None:
        """Forget the stream's node (and tell it to abort the request when `abort`)."""
        node, self._node, self._stream = self._node, None, None
        if node is None:
            return
        self._s.picker.end(node.node_id)
        if abort:
            self._s.spawn(self._s.require_nodes().abort(node, self._request.request_id))

    async def close_stream(self) -> None:
        await self._stream_ctx.aclose()


def importers_of(kv: KVHandle) -> Candidates:
    """The decode nodes that import the KV of `kv`."""
    return lambda pools: kv_importers(pools.decode, kv)


def kv_importers(nodes: Sequence[NodeRecord], kv: KVHandle) -> list[NodeRecord]:
    """The nodes that import the KV of `kv`: of its layout (theirs, or one they convert),
    and of a protocol version at most one from the prefill node's that wrote it."""
    return [
        n for n in _of_layout(nodes, kv) if compatible(n.info.protocol_version, kv.protocol_version)
    ]


def _of_layout(nodes: Sequence[NodeRecord], kv: KVHandle) -> list[NodeRecord]:
    fingerprint = kv.layout_fingerprint
    return [
        n for n in nodes if fingerprint in (n.info.layout_fingerprint, *n.info.import_fingerprints)
    ]


def _no_importer(nodes: Sequence[NodeRecord], kv: KVHandle, request_id: str) -> str:
    """Why no decode node imports `kv` (the local prefill's reason), logged when it is the
    protocol: a pair of versions more than one apart is never chosen."""
    if not nodes:
        return "no_decode_node"
    if not _of_layout(nodes, kv):
        return "layout_mismatch"
    log.info(
        "protocol_mismatch id=%s prefill_node=%s prefill_version=%d decode_versions=%s",
        request_id, kv.node_id, kv.protocol_version,
        ",".join(sorted({str(n.info.protocol_version) for n in nodes})),
    )  # fmt: skip
    return "protocol_mismatch"
