"""One request's path through the cluster, in token ids (DESIGN.md, request flow).

`start()` does everything before token 1 that can still fail with a plain HTTP status:
pick a prefill node and prefill (retrying other prefill nodes on failure), or, for short
prompts and when no prefill pool can help, open a decode stream that prefills locally.
`events()` then yields token 1 at once and streams the decode: after a remote prefill it
picks a decode node and hands it the KV handle; when a decode node dies mid-way it resumes
on another from prompt + tokens so far, or raises a 503 APIError. `close()` always runs
last: it aborts a decode the client no longer wants, releases a KV lease nobody took, and
frees the admission slot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import AsyncExitStack

from cluster.protocol import (
    DecodeRequest,
    KVHandle,
    NodeInfo,
    NodeRecord,
    PrefillRequest,
    PrefillResponse,
    TokenEvent,
)
from models.sampling_params import SamplingParams
from router.admission import Ticket
from router.errors import APIError, bad_request, overloaded, unavailable
from router.kv_index import PrefixQuery
from router.node_client import NodeCallError
from router.output import TokenChunk
from router.policy import Pools, saturated
from router.state import RouterState

log = logging.getLogger("splitserve.router")


class TokenFlow:
    """Prefill -> decode for one request, with retries, deadlines and cleanup."""

    def __init__(
        self,
        state: RouterState,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        ticket: Ticket,
        arrived_at: float,
        priority: int = 0,
        timeout_s: float | None = None,
    ) -> None:
        """`timeout_s` (the request's own) shortens the router's request_timeout_s."""
        self._s = state
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self._query = PrefixQuery(prompt_ids)
        self._decode_predicted = 0  # prompt tokens the index expected on the decode node
        self._decode_recorded = True  # the open decode stream's prefix hits are counted
        self.sampling = sampling
        self.priority = priority
        self._ticket = ticket
        self.arrived_at = arrived_at
        limit = state.settings.request_timeout_s
        self.own_deadline = timeout_s is not None and timeout_s < limit  # the client's
        self.deadline = arrived_at + (min(limit, timeout_s) if timeout_s else limit)
        self.output_ids: list[int] = []
        self.num_cached_tokens = 0
        self.ttft_s: float | None = None
        self._last_token_at = 0.0
        self.path = "none"  # "disaggregated" or "local"
        self.error: str | None = None
        self._prefill: PrefillResponse | None = None
        self._prefill_node: NodeInfo | None = None
        self._lease_holder: NodeInfo | None = None  # prefill node pinning KV nobody took yet
        self._decode: NodeInfo | None = None
        self._decode_kv: KVHandle | None = None
        self._stream: AsyncIterator[TokenEvent] | None = None
        self._stream_ctx = AsyncExitStack()
        self._decode_tried: set[str] = set()
        self._finished = False
        self._closed = False
        self.counts_prompt = True  # False for the sibling samples of an n > 1 request

    # ------------------------------------------------------------ before token 1

    async def start(self) -> None:
        """Prefill remotely or open a local-prefill decode; raises APIError on failure."""
        pools = Pools.of(self._s.membership.nodes())
        if not pools.local:
            raise unavailable("no decode node is available", self._s.settings.retry_after_s)
        reason = self._local_reason(pools)
        if reason is None:
            if saturated(pools.prefill, self._s.settings.max_queue):
                raise overloaded("every prefill node is at its queue limit", self._retry_after)
            if await self._remote_prefill(pools.prefill):
                return
            reason = "prefill_failed"
        if saturated(pools.local, self._s.settings.max_queue):
            raise overloaded("every decode node is at its queue limit", self._retry_after)
        self._s.metrics.local_prefill.labels(reason).inc()
        self.path = "local"
        await self._open_decode(pools.local, kv=None)

    async def start_beside(self, node_id: str | None) -> None:
        """A sibling sample (n > 1) of a request whose prompt KV is on decode node `node_id`:
        prefill locally there, where the prefix cache holds the prompt's full blocks, so only
        the partial last block is computed again. Elsewhere (node gone, busy, or None): start()."""
        near = [n for n in Pools.of(self._s.membership.nodes()).local if n.info.node_id == node_id]
        if near:
            try:
                await self._open_decode(near, kv=None)
            except APIError:
                pass
            else:
                self._s.metrics.local_prefill.labels("sibling_sample").inc()
                self.path = "local"
                return
        await self.start()

    @property
    def decode_node_id(self) -> str | None:
        """The decode node streaming this request now, if any."""
        return self._decode.node_id if self._decode is not None else None

    @property
    def _retry_after(self) -> int:
        return self._s.settings.retry_after_s

    def _local_reason(self, pools: Pools) -> str | None:
        """Why this request skips the prefill pool, or None to use it."""
        if not pools.prefill:
            return "no_prefill_node"
        if not pools.decode:
            return "no_decode_node"
        if len(self.prompt_ids) < self._s.settings.local_prefill_max_tokens:
            return "short_prompt"
        return None

    async def _remote_prefill(self, candidates: Sequence[NodeRecord]) -> bool:
        req = PrefillRequest(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_ids,
            sampling=self.sampling,
            priority=self.priority,
        )
        tried: set[str] = set()
        busy = 0
        while len(tried) < self._s.settings.prefill_attempts:
            node = self._s.picker.pick("prefill", candidates, tried, self._query)
            if node is None:
                break
            left = [c.info.node_id for c in candidates if c.info.node_id not in tried]
            predicted = self._s.kv.routed("prefill", self._query, node.info.node_id, left)
            if tried:
                self._s.metrics.prefill_retries.inc()
            tried.add(node.info.node_id)
            try:
                resp = await self._prefill_on(node.info, req)
            except NodeCallError as err:
                busy += err.kind == "busy"
                continue
            self._accept_prefill(node.info, resp)
            self._s.kv.record("prefill", node.info.node_id, predicted, resp.num_cached_tokens)
            return True
        if tried and busy == len(tried):
            raise overloaded("every prefill node is busy", self._retry_after)
        return False

    async def _prefill_on(self, node: NodeInfo, req: PrefillRequest) -> PrefillResponse:
        picker, nodes = self._s.picker, self._s.require_nodes()
        picker.begin(node.node_id)
        try:
            return await nodes.prefill(node, req, self.deadline)
        except NodeCallError as err:
            if err.kind == "deadline":  # the request's time, not the node's fault
                self._s.spawn(nodes.release(node, self.request_id))
                raise self._deadline_error() from None
            self._node_failed("prefill", err)
            if err.kind == "refused":
                raise self._refused(err) from None
            if err.kind == "unreachable":  # maybe only slow: let it drop the lease now
                self._s.spawn(nodes.release(node, self.request_id))
            raise
        finally:
            picker.end(node.node_id)

    def _accept_prefill(self, node: NodeInfo, resp: PrefillResponse) -> None:
        self._prefill, self._prefill_node = resp, node
        self.path = "disaggregated"
        self.num_cached_tokens = resp.num_cached_tokens
        if resp.kv is not None and not resp.finished:
            self._lease_holder = node
        self._tokens_arrived(1)

    def _tokens_arrived(self, n: int) -> None:
        """TTFT for the first token, ITL for each later one (0 for tokens that came together)."""
        now, metrics = time.monotonic(), self._s.metrics
        if self.ttft_s is None:
            self.ttft_s = now - self.arrived_at
            metrics.ttft.observe(self.ttft_s)
        else:
            metrics.itl.observe(now - self._last_token_at)
        for _ in range(n - 1):
            metrics.itl.observe(0.0)
        self._last_token_at = now

    # ------------------------------------------------------------ decode

    async def _open_decode(self, candidates: Sequence[NodeRecord], kv: KVHandle | None) -> None:
        """Start /internal/generate on one of `candidates`; raises APIError if none accepts."""
        busy = tried = 0
        while len(self._decode_tried) < self._s.settings.decode_attempts:
            node = self._s.picker.pick("decode", candidates, self._decode_tried, self._query)
            if node is None:
                break
            left = [c.info.node_id for c in candidates if c.info.node_id not in self._decode_tried]
            self._decode_predicted = self._s.kv.routed(
                node.info.role, self._query, node.info.node_id, left
            )
            self._decode_tried.add(node.info.node_id)
            tried += 1
            req = DecodeRequest(
                request_id=self.request_id,
                prompt_token_ids=self.prompt_ids,
                output_token_ids=list(self.output_ids),
                sampling=self.sampling,
                kv=kv,
                priority=self.priority,
                wait_s=max(self.deadline - time.monotonic(), 0.001),
            )
            try:
                ctx = self._s.require_nodes().generate(node.info, req, self.deadline)
                self._stream = await self._stream_ctx.enter_async_context(ctx)
            except NodeCallError as err:
                self._node_failed("decode", err)
                if err.kind == "refused":
                    raise self._refused(err) from None
                busy += err.kind == "busy"
                continue
            self._decode, self._decode_kv = node.info, kv
            self._decode_recorded = False
            self._s.picker.begin(node.info.node_id)
            if kv is not None:
                self._lease_holder = None  # the decode node owns the lease now
            return
        if busy and busy == tried:
            raise overloaded("every decode node is busy", self._retry_after)
        raise unavailable("no decode node could take the request", self._retry_after)

    async def _decode_after_prefill(self, kv: KVHandle) -> None:
        pools = Pools.of(self._s.membership.nodes())
        matching = [n for n in pools.decode if n.info.layout_fingerprint == kv.layout_fingerprint]
        if matching:
            await self._open_decode(matching, kv)
            return
        reason = "layout_mismatch" if pools.decode else "no_decode_node"
        self._s.metrics.local_prefill.labels(reason).inc()
        self._release_lease()
        await self._open_decode(pools.local, kv=None)

    async def events(self) -> AsyncGenerator[TokenChunk, None]:
        """Token 1 (after a remote prefill), then the decode stream, until finished."""
        if self._prefill is not None:
            first = self._prefill
            self.output_ids.append(first.first_token_id)
            finish = (first.finish_reason or "stop") if first.finished else None
            self._finished = first.finished
            logprobs = [first.first_logprob] if first.first_logprob is not None else None
            yield TokenChunk([first.first_token_id], logprobs, finish)
            if first.finished:
                return
            if first.kv is None:
                raise unavailable("the prefill node returned no KV handle", self._retry_after)
            await self._decode_after_prefill(first.kv)
        while not self._finished:
            try:
                async for chunk in self._read_stream():
                    yield chunk
            except NodeCallError as err:
                self._node_failed("decode", err)
                if err.kind == "deadline":
                    self.error = "deadline"
                    raise self._deadline_error() from None
                await self._resume(err)

    async def _read_stream(self) -> AsyncIterator[TokenChunk]:
        if self._stream is None:
            raise RuntimeError("no decode stream is open")
        async for event in self._stream:
            if self.path == "local" and not self.output_ids:
                self.num_cached_tokens = event.num_cached_tokens
            if not self._decode_recorded and self._decode is not None:
                self._decode_recorded = True
                # after an import, the tokens it did not read; else those it did not compute
                imported = self._decode_kv is not None
                actual = event.num_prefix_hit_tokens if imported else event.num_cached_tokens
                pool, node_id = self._decode.role, self._decode.node_id
                self._s.kv.record(pool, node_id, self._decode_predicted, actual)
            if event.token_ids:
                self._tokens_arrived(len(event.token_ids))
            self.output_ids.extend(event.token_ids)
            self._finished = event.finished
            yield TokenChunk(event.token_ids, event.logprobs, event.finish_reason or None)

    async def _resume(self, err: NodeCallError) -> None:
        """After a decode failure: recompute on another decode node, or raise a 503."""
        self._end_decode()
        await self._stream_ctx.aclose()
        if self._decode_kv is not None and self._prefill_node is not None:
            # the failed node may not have pulled the blocks: free them now, not at expiry
            self._s.spawn(self._s.require_nodes().release(self._prefill_node, self.request_id))
        self.error = str(err)
        if len(self.output_ids) >= self.sampling.max_tokens:
            raise unavailable(f"decode failed at the last token: {err}", self._retry_after)
        self._s.metrics.decode_resumes.inc()
        log.warning("decode_resume id=%s tokens_so_far=%d", self.request_id, len(self.output_ids))
        try:
            await self._open_decode(Pools.of(self._s.membership.nodes()).local, kv=None)
        except APIError:
            raise unavailable(
                f"the decode node failed mid-generation and no other took over ({err})",
                self._retry_after,
                code="node_failed",
            ) from None
        self.error = None

    # ------------------------------------------------------------ errors and cleanup

    def _node_failed(self, role: str, err: NodeCallError) -> None:
        self._s.metrics.node_errors.labels(role, err.kind).inc()
        log.warning(
            "node_call_failed id=%s role=%s node=%s kind=%s error=%s",
            self.request_id, role, err.node_id, err.kind, err,
        )  # fmt: skip
        if err.kind == "unreachable":
            self._s.membership.mark_unhealthy(err.node_id)

    def _deadline_error(self) -> APIError:
        """408 when the request's own `timeout` ran out, 504 for the router's limit."""
        if self.own_deadline:
            return APIError(
                408, "the request ran past its `timeout`", param="timeout", code="timeout"
            )
        return APIError(
            504, "the request ran past its deadline", type="server_error", code="timeout"
        )

    def _refused(self, err: NodeCallError) -> APIError:
        info = err.info
        return bad_request(
            info.message if info else str(err), param=info.param if info else None, code="refused"
        )

    def _release_lease(self) -> None:
        if self._lease_holder is not None:
            holder, self._lease_holder = self._lease_holder, None
            self._s.spawn(self._s.require_nodes().release(holder, self.request_id))

    def _end_decode(self) -> NodeInfo | None:
        node, self._decode, self._stream = self._decode, None, None
        if node is not None:
            self._s.picker.end(node.node_id)
        return node

    async def stop(self) -> None:
        """End the decode now (a stop string ended the text): abort it if unfinished and
        close its stream. close() still runs later."""
        node = self._end_decode()
        if not self._finished and node is not None:
            self._s.spawn(self._s.require_nodes().abort(node, self.request_id))
        await self._stream_ctx.aclose()

    async def close(self) -> None:
        """Idempotent: abort an unfinished decode, release an untaken lease, free the slot."""
        if self._closed:
            return
        self._closed = True
        node = self._end_decode()
        if not self._finished and node is not None:
            self._s.spawn(self._s.require_nodes().abort(node, self.request_id))
        self._release_lease()
        try:
            await self._stream_ctx.aclose()
        finally:
            self._ticket.release()
            self._record()

    def _record(self) -> None:
        metrics, elapsed = self._s.metrics, time.monotonic() - self.arrived_at
        metrics.request_latency.observe(elapsed)
        if self.counts_prompt:
            metrics.prompt_tokens.inc(len(self.prompt_ids))
        metrics.completion_tokens.inc(len(self.output_ids))
        ttft_ms = f"{self.ttft_s * 1000:.1f}" if self.ttft_s is not None else "none"
        log.info(
            "request_done id=%s path=%s prompt_tokens=%d completion_tokens=%d cached_tokens=%d "
            "finished=%s ttft_ms=%s total_ms=%.1f error=%s",
            self.request_id, self.path, len(self.prompt_ids), len(self.output_ids),
            self.num_cached_tokens, self._finished, ttft_ms, elapsed * 1000, self.error,
        )  # fmt: skip
