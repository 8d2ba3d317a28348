"""One request's path through the cluster: the prefill leg, the decode leg and the KV lease
between them, with deadlines, cleanup and the request's record.

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
from collections.abc import AsyncGenerator

from cluster.node_records import NodeRecord
from cluster.protocol import PrefillResponse, TokenEvent
from cluster.tracing import now_ns
from router.admission import Ticket
from router.api.text_deltas import TokenChunk
from router.errors import APIError, overloaded, unavailable
from router.flow.decode_leg import DecodeLeg, local_nodes
from router.flow.failures import node_failed
from router.flow.lease import KVLease
from router.flow.prefill_leg import Prefilled, PrefillLeg
from router.flow.request import Deadline, FlowRequest
from router.flow.shared_prompt import SharedPrompt
from router.flow.timing import TokenClock
from router.node_client import NodeCallError
from router.routing.policy import Pools, saturated
from router.routing.prefix_index import PrefixQuery
from router.state import RouterState
from router.trail import Trail

log = logging.getLogger("splitserve.router")


class RequestFlow:
    """Prefill -> decode for one request, with retries, deadlines and cleanup."""

    def __init__(
        self,
        state: RouterState,
        request: FlowRequest,
        ticket: Ticket | None,
        beside: SharedPrompt | None = None,
        trail: Trail | None = None,
    ) -> None:
        """`ticket`: the admission slot close() frees; None for the sibling samples of an
        n > 1 request, whose slot sample 0 holds. `beside`: for a sibling sample, where
        sample 0 leaves the prompt's KV; start() waits for it and starts on that node.
        `trail`: the request's phases (GET /debug/requests, traces); close() finishes it."""
        self._s = state
        self.request = request
        self._ticket = ticket
        self._beside = beside
        self._deadline = Deadline.of(request, state.settings.request_timeout_s)
        query = PrefixQuery(request.prompt_ids, request.lora.name if request.lora else None)
        self._lease = KVLease(state, request.request_id)
        self.trail = trail or Trail(request.request_id, now_ns())
        legs = (state, request, query, self._deadline, self._lease, self.trail)
        self._prefill = PrefillLeg(*legs)
        self._decode = DecodeLeg(*legs)
        self._clock = TokenClock(state.metrics, request.arrived_at)
        self._first: PrefillResponse | None = None  # the remote prefill's answer
        self.output_ids: list[int] = []
        self.num_cached_tokens = 0
        self.path = "none"  # "disaggregated" or "local"
        self.error: str | None = None
        self._finished = False
        self._closed = False

    @property
    def decode_node_id(self) -> str | None:
        """The decode node streaming this request now, if any."""
        node = self._decode.node
        return node.node_id if node is not None else None

    @property
    def prompt_kv_node_id(self) -> str | None:
        """The decode node whose prefix cache holds the prompt's full blocks, once it does:
        it streamed a token of its own (after a remote prefill: token 2)."""
        if self.path == "local" or len(self.output_ids) >= 2:
            return self.decode_node_id
        return None

    # ------------------------------------------------------------ before token 1

    async def start(self) -> None:
        """Prefill remotely or open a local-prefill decode; raises APIError on failure."""
        if self._beside is not None and await self._start_beside(await self._beside.node_id()):
            return
        pools = Pools.of(self._s.membership.nodes())
        retry_after, max_queue = self._s.settings.retry_after_s, self._s.settings.max_queue
        if not pools.local:
            raise unavailable("no decode node is available", retry_after)
        reason = self._local_reason(pools)
        if reason is None:
            if saturated(pools.prefill, max_queue):
                raise overloaded("every prefill node is at its queue limit", retry_after)
            prefilled = await self._prefill.run(pools.prefill)
            if prefilled is not None:
                self._prefilled(prefilled)
                return
            reason = "prefill_failed"
        if saturated(pools.local, max_queue):
            raise overloaded("every decode node is at its queue limit", retry_after)
        self._s.metrics.local_prefill.labels(reason).inc()
        self.path = "local"
        await self._decode.open(local_nodes, None, self.output_ids)

    async def _start_beside(self, node_id: str | None) -> bool:
        """A sibling sample on the decode node holding the prompt's KV: a local prefill there
        finds the full blocks in its prefix cache and computes only the partial last one.
        False when that node is gone, busy or unknown (then the sample starts as a plain one)."""

        def near(pools: Pools) -> list[NodeRecord]:
            return [n for n in pools.local if n.info.node_id == node_id]

        if not near(Pools.of(self._s.membership.nodes())):
            return False
        try:
            await self._decode.open(near, None, self.output_ids)
        except APIError:
            return False
        self._s.metrics.local_prefill.labels("sibling_sample").inc()
        self.path = "local"
        return True

    def _local_reason(self, pools: Pools) -> str | None:
        """Why this request skips the prefill pool, or None to use it."""
        if not pools.prefill:
            return "no_prefill_node"
        if not pools.decode:
            return "no_decode_node"
        if len(self.request.prompt_ids) < self._s.settings.local_prefill_max_tokens:
            return "short_prompt"
        return None

    def _prefilled(self, prefilled: Prefilled) -> None:
        node, answer = prefilled
        self._lease.granted(node, answer)
        self._first = answer
        self.path = "disaggregated"
        self.num_cached_tokens = answer.num_cached_tokens
        self._clock.tokens_arrived(1)

    # ------------------------------------------------------------ tokens

    async def events(self) -> AsyncGenerator[TokenChunk, None]:
        """Token 1 (after a remote prefill), then the decode stream, until finished."""
        if self._first is not None:
            self.trail.token_one()
            first = self._first
            self.output_ids.append(first.first_token_id)
            finish = (first.finish_reason or "stop") if first.finished else None
            self._finished = first.finished
            logprobs = [first.first_logprob] if first.first_logprob is not None else None
            yield TokenChunk([first.first_token_id], logprobs, finish)
            if first.finished:
                return
            if first.kv is None:
                retry_after = self._s.settings.retry_after_s
                raise unavailable("the prefill node returned no KV handle", retry_after)
            await self._decode.open_with(first.kv, self.output_ids)
        while not self._finished:
            try:
                async for event in self._decode.read():
                    yield self._took(event)
            except NodeCallError as err:
                node_failed(self._s, self.request.request_id, "decode", err)
                if err.kind == "deadline":
                    self.error = "deadline"
                    raise self._deadline.error() from None
                self.error = str(err)
                await self._decode.resume(err, self.output_ids)
                self.error = None

    def _took(self, event: TokenEvent) -> TokenChunk:
        if self.path == "local" and not self.output_ids:
            self.num_cached_tokens = event.num_cached_tokens
            self.trail.token_one()
        if event.token_ids:
            self._clock.tokens_arrived(len(event.token_ids))
        self.output_ids.extend(event.token_ids)
        self._finished = event.finished
        return TokenChunk(event.token_ids, event.logprobs, event.finish_reason or None)

    # ------------------------------------------------------------ cleanup

    async def stop(self) -> None:
        """End the decode now (a stop string ended the text): abort it if unfinished and
        close its stream. close() still runs later."""
        self._decode.end(abort=not self._finished)
        await self._decode.close_stream()

    async def close(self) -> None:
        """Idempotent: abort an unfinished decode, release an untaken lease, free the slot."""
        if self._closed:
            return
        self._closed = True
        self._decode.end(abort=not self._finished)
        self._lease.release()
        try:
            await self._decode.close_stream()
        finally:
            if self._ticket is not None:
                self._ticket.release()
            self._record()
            outcome = "ok" if self._finished else self.error or "incomplete"
            self.trail.finish(outcome, len(self.output_ids))
            self._s.requests.done(self.trail)

    def _record(self) -> None:
        metrics, elapsed = self._s.metrics, time.monotonic() - self.request.arrived_at
        prompt_tokens = len(self.request.prompt_ids)
        metrics.request_latency.observe(elapsed)
        if self.request.counts_prompt:
            metrics.prompt_tokens.inc(prompt_tokens)
        metrics.completion_tokens.inc(len(self.output_ids))
        ttft_s = self._clock.ttft_s
        ttft_ms = f"{ttft_s * 1000:.1f}" if ttft_s is not None else "none"
        log.info(
            "request_done id=%s path=%s prompt_tokens=%d completion_tokens=%d cached_tokens=%d "
            "finished=%s ttft_ms=%s total_ms=%.1f error=%s",
            self.request.request_id, self.path, prompt_tokens, len(self.output_ids),
            self.num_cached_tokens, self._finished, ttft_ms, elapsed * 1000, self.error,
        )  # fmt: skip
