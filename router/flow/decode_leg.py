"""The decode leg: a decode stream for one request, opened with the prefill's KV handle or
with a local prefill, read token by token, and resumed on another node when one fails."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack

from cluster.protocol import DecodeRequest, KVHandle, NodeInfo, NodeRecord, TokenEvent
from router.errors import APIError, overloaded, unavailable
from router.flow.failures import node_failed, refused
from router.flow.lease import KVLease
from router.flow.leg import Leg
from router.flow.request import Deadline, FlowRequest
from router.node_client import NodeCallError
from router.routing.policy import Pools
from router.routing.prefix_index import PrefixQuery
from router.state import RouterState

log = logging.getLogger("splitserve.router")


class DecodeLeg(Leg):
    """At most one open /internal/generate stream at a time; every decode node it tried
    (up to `decode_attempts`) is tried once only."""

    def __init__(
        self,
        state: RouterState,
        request: FlowRequest,
        query: PrefixQuery,
        deadline: Deadline,
        lease: KVLease,
    ) -> None:
        super().__init__(state, request, query, deadline, lease)
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
        """After a remote prefill: a decode node of the same KV layout imports the blocks;
        when there is none, release the lease and prefill locally instead."""
        pools = Pools.of(self._s.membership.nodes())
        matching = [n for n in pools.decode if n.info.layout_fingerprint == kv.layout_fingerprint]
        if matching:
            await self.open(matching, kv, output_ids)
            self._lease.taken()
            return
        reason = "layout_mismatch" if pools.decode else "no_decode_node"
        self._s.metrics.local_prefill.labels(reason).inc()
        self._lease.release()
        await self.open(pools.local, None, output_ids)

    async def open(
        self, candidates: Sequence[NodeRecord], kv: KVHandle | None, output_ids: list[int]
    ) -> None:
        """Start /internal/generate on one of `candidates`; raises APIError if none accepts."""
        state = self._s
        busy = tried = 0
        while len(self._tried) < state.settings.decode_attempts:
            node = state.picker.pick("decode", candidates, self._tried, self._query)
            if node is None:
                break
            left = [c.info.node_id for c in candidates if c.info.node_id not in self._tried]
            predicted = state.kv.routed(node.info.role, self._query, node.info.node_id, left)
            self._tried.add(node.info.node_id)
            tried += 1
            try:
                await self._open_on(node.info, kv, output_ids)
            except NodeCallError as err:
                node_failed(state, self._request.request_id, "decode", err)
                if err.kind == "refused":
                    raise refused(err) from None
                busy += err.kind == "busy"
                continue
            self._node, self._imported = node.info, kv is not None
            self._predicted, self._recorded = predicted, False
            state.picker.begin(node.info.node_id)
            return
        if busy and busy == tried:
            raise overloaded("every decode node is busy", self._retry_after)
        raise unavailable("no decode node could take the request", self._retry_after)

    async def _open_on(self, node: NodeInfo, kv: KVHandle | None, output_ids: list[int]) -> None:
        req = DecodeRequest(
            request_id=self._request.request_id,
            prompt_token_ids=self._request.prompt_ids,
            output_token_ids=list(output_ids),
            sampling=self._request.sampling,
            kv=kv,
            priority=self._request.priority,
            wait_s=self._deadline.left_s(),
            lora=self._request.lora,
        )
        ctx = self._s.require_nodes().generate(node, req, self._deadline.at)
        self._stream = await self._stream_ctx.enter_async_context(ctx)

    async def read(self) -> AsyncIterator[TokenEvent]:
        """The open stream's events; the first one's prefix hits go to the KV index."""
        if self._stream is None:
            raise RuntimeError("no decode stream is open")
        async for event in self._stream:
            if not self._recorded and self._node is not None:
                self._recorded = True
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
            await self.open(Pools.of(self._s.membership.nodes()).local, None, output_ids)
        except APIError:
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
