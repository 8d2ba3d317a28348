"""The prefill role: compute the prompt, sample token 1, pin the KV blocks under a lease.

A lease ends exactly once: when the decode node's READ-complete notice arrives, on
POST /internal/release, or at expiry. Whichever comes first frees the blocks through
`engine.release`, run in the engine thread.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping

from cluster.protocol import (
    PROTOCOL_VERSION,
    KVHandle,
    PrefillRequest,
    PrefillResponse,
    TokenLogprobMsg,
)
from engine.engine import LLMEngine
from engine.loop.engine_loop import EngineLoop
from engine.loop.stream import EngineFailed, RequestStream, StreamOutput
from engine.lora.request import LoRARequest
from engine.scheduler.request import FinishReason
from kv_transfer import LeaseTable
from models.sampling_params import SamplingParams
from node.core import NodeCore
from node.errors import NodeError, bad_request, checked_async
from node.metrics import NodeMetrics
from node.settings import NodeSettings
from node.spans import NodeSpans

log = logging.getLogger("splitserve.prefill")

FIRST_TOKEN_TIMEOUT_S = 300.0  # a prefill queued longer than this answers 503


class PrefillRuntime(NodeCore):
    """A prefill node: the node core with the owner side of the transfer agent and leases."""

    def __init__(
        self, settings: NodeSettings, loop: EngineLoop, started_at: float, metrics: NodeMetrics
    ) -> None:
        super().__init__(settings, loop, started_at, metrics)
        self.leases = LeaseTable(on_free=self._free_lease)
        self._inflight: dict[str, bool] = {}  # request id -> released while computing

    def _leases(self) -> LeaseTable:
        return self.leases

    # ---- requests -------------------------------------------------------------------------

    async def prefill(
        self, req: PrefillRequest, headers: Mapping[str, str] | None = None
    ) -> PrefillResponse:
        """Token 1 and, unless the request ended there, a lease on its KV blocks. `headers`:
        the call's, whose trace context makes this node's spans children of the caller's."""
        rid = req.request_id
        arrived = time.monotonic()
        if rid in self._inflight:
            raise bad_request(f"request id {rid!r} is already being prefilled", "request_id")
        lora = await self.adapters.resolve(req.lora)
        self.counts["requests_total"] += 1
        self._inflight[rid] = False
        try:
            start = functools.partial(
                _add,
                rid=rid,
                prompt=list(req.prompt_token_ids),
                params=req.sampling,
                priority=req.priority,
                lora=lora,
            )
            stream = await checked_async(self.loop.open(rid, start), "prompt_token_ids")
        except BaseException:
            self._inflight.pop(rid)
            raise
        self.metrics.prompt_tokens.inc(len(req.prompt_token_ids))
        response = None
        try:
            item = await _first_output(stream)
            if item.scheduled_at is not None:
                self.metrics.queue_time.observe(max(item.scheduled_at - arrived, 0.0))
            response = self._answer(req, item)
            self.metrics.ttft.observe(time.monotonic() - arrived)
            _trace(NodeSpans(self.tracer, headers), arrived, item)
            return response
        finally:
            self._inflight.pop(rid)
            if response is None:
                self.loop.post_abort(rid)  # cancelled or failed: free whatever it holds

    def _answer(self, req: PrefillRequest, item: StreamOutput) -> PrefillResponse:
        out = item.output
        if not out.new_token_ids or self._inflight.get(req.request_id):
            raise NodeError(503, "aborted", f"request {req.request_id} was released or aborted")
        kv = None
        if out.finish_reason is FinishReason.PREFILLED:
            kv = self._lease(req.request_id, item.pinned_block_ids, out.num_prompt_tokens)
            if req.lora is not None:
                kv = kv.model_copy(update={"lora_name": req.lora.name})
        else:
            self.counts["finished_at_first_token_total"] += 1
        logprob = out.logprobs[0] if out.logprobs else None
        return PrefillResponse(
            request_id=req.request_id,
            first_token_id=out.new_token_ids[0],
            first_logprob=TokenLogprobMsg.model_validate(logprob, from_attributes=True)
            if logprob is not None
            else None,
            finished=kv is None,
            finish_reason=out.finish_reason.value if kv is None and out.finish_reason else None,
            num_prompt_tokens=out.num_prompt_tokens,
            num_cached_tokens=out.num_cached_tokens,
            kv=kv,
        )

    def _lease(self, rid: str, block_ids: tuple[int, ...], num_tokens: int) -> KVHandle:
        ttl = self.settings.lease_ttl_s
        self.leases.grant(rid, block_ids, ttl)
        self.counts["leases_granted_total"] += 1
        return KVHandle(
            node_id=self.info.node_id,
            peer_info=self.info.peer_info,
            block_ids=list(block_ids),
            num_tokens=num_tokens,
            layout_fingerprint=self.info.layout_fingerprint,
            lease_expires_at=time.time() + ttl,
            protocol_version=PROTOCOL_VERSION,
        )

    async def release(self, request_id: str) -> bool:
        """End a request's lease, or abort its prefill when it is still computing."""
        if self.leases.release(request_id):
            self.counts["leases_released_by_router_total"] += 1
            return True
        if request_id in self._inflight:
            self._inflight[request_id] = True
            await self.loop.abort(request_id)
            return True
        return False

    def _free_lease(self, request_id: str, _block_ids: list[int]) -> None:
        """LeaseTable hook (any thread): give the blocks back in the engine thread."""
        self.counts["leases_ended_total"] += 1
        self.loop.post(lambda engine: engine.release(request_id))


def _trace(spans: NodeSpans, arrived: float, item: StreamOutput) -> None:
    """prefill.queue (until the engine first scheduled it), prefill.compute (until token 1)."""
    if not spans.on:
        return
    scheduled = item.scheduled_at if item.scheduled_at is not None else arrived
    out = item.output
    spans.record("prefill.queue", arrived, scheduled)
    attrs = {
        "splitserve.prompt_tokens": out.num_prompt_tokens,
        "splitserve.cached_tokens": out.num_cached_tokens,
        "splitserve.chunks": item.steps,
    }
    spans.record("prefill.compute", scheduled, time.monotonic(), attrs)


async def _first_output(stream: RequestStream) -> StreamOutput:
    try:
        return await stream.get(FIRST_TOKEN_TIMEOUT_S)
    except TimeoutError:
        raise NodeError(503, "timeout", "no first token within the deadline") from None
    except EngineFailed as exc:
        raise NodeError(500, "engine_failed", str(exc)) from None


def _add(
    engine: LLMEngine,
    *,
    rid: str,
    prompt: list[int],
    params: SamplingParams,
    priority: int,
    lora: LoRARequest | None,
) -> None:
    engine.add_request(rid, prompt, params, priority, lora=lora)
