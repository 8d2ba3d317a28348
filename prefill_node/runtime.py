"""The prefill role: compute the prompt, sample token 1, pin the KV blocks under a lease.

A lease ends exactly once: when the decode node's READ-complete notice arrives, on
POST /internal/release, or at expiry. Whichever comes first frees the blocks through
`engine.release`, run in the engine thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict

from cluster.models import resolve_model
from cluster.node_errors import NodeError, bad_request, checked, checked_async
from cluster.node_metrics import NodeMetrics
from cluster.node_server import (
    engine_options,
    node_info,
    node_load,
    transfer_options,
)
from cluster.protocol import (
    KVHandle,
    NodeInfo,
    NodeLoad,
    PrefillRequest,
    PrefillResponse,
    TokenLogprobMsg,
)
from cluster.settings import NodeSettings
from engine.engine import LLMEngine
from engine.loop import EngineFailed, EngineLoop, LoopOutput, RequestStream, engine_config
from engine.request import FinishReason
from engine.sampling_params import SamplingParams
from kv_transfer import KVTransferAgent, LeaseTable, TransferConfig

log = logging.getLogger("splitserve.prefill")

FIRST_TOKEN_TIMEOUT_S = 300.0  # a prefill queued longer than this answers 503


class PrefillRuntime:
    """A prefill node's engine thread, transfer agent (owner side) and lease table."""

    def __init__(
        self, settings: NodeSettings, loop: EngineLoop, started_at: float, metrics: NodeMetrics
    ) -> None:
        self.settings = settings
        self.loop = loop
        self.metrics = metrics
        self.leases = LeaseTable(on_free=self._free_lease)
        self.agent: KVTransferAgent | None = None
        self.started_at = started_at
        self._counts: Counter[str] = Counter()
        self._inflight: dict[str, bool] = {}  # request id -> released while computing
        self._info: NodeInfo | None = None

    @classmethod
    @asynccontextmanager
    async def open(
        cls, settings: NodeSettings, metrics: NodeMetrics
    ) -> AsyncIterator[PrefillRuntime]:
        """Load the model, start the engine thread and the transfer agent; stop them after."""
        started_at = time.time()
        model_dir = await asyncio.to_thread(resolve_model, settings.model, settings.model_cache)
        config = engine_config(model_dir, **engine_options(settings))
        loop = await EngineLoop.launch(config, settings.torch_threads)
        runtime = cls(settings, loop, started_at, metrics)
        try:
            runtime.agent = await asyncio.to_thread(runtime._make_agent)
            serving = asyncio.create_task(runtime.agent.serve(), name="lease-serve")
            try:
                yield runtime
            finally:
                serving.cancel()
                runtime.agent.close()
        finally:
            await asyncio.to_thread(loop.stop)

    def _make_agent(self) -> KVTransferAgent:
        layout = self.loop.engine.runner.layout
        return KVTransferAgent(
            self.loop.engine.runner.kv_cache,
            fingerprint=layout.fingerprint(),
            layout=layout.describe(),
            config=TransferConfig(**transfer_options(self.settings)),
            leases=self.leases,
        )

    # ---- NodeRuntime ----------------------------------------------------------------------

    @property
    def info(self) -> NodeInfo:
        if self._info is None:
            if self.agent is None:
                raise RuntimeError("PrefillRuntime.info before the agent started")
            engine = self.loop.engine
            self._info = node_info(
                self.settings,
                layout_fingerprint=engine.runner.layout.fingerprint(),
                peer_info=self.agent.info.to_json(),
                max_model_len=engine.max_model_len,
                capacity=engine.block_manager.num_total_blocks,
                started_at=self.started_at,
            )
        return self._info

    @property
    def healthy(self) -> bool:
        return self.loop.running

    def load(self) -> NodeLoad:
        stats = self.loop.snapshot.stats
        return node_load(
            running=stats.running,
            waiting=stats.waiting,
            free_blocks=stats.free_blocks,
            total_blocks=stats.total_blocks,
            leases_held=self.leases.held().leases,
        )

    def counters(self) -> dict[str, float]:
        out: dict[str, float] = dict(self._counts)
        out.update(asdict(self.loop.snapshot.counters))
        out["prefix_query_tokens"] = self.loop.snapshot.prefix_query_tokens
        if self.agent is not None:
            out.update({f"transfer_{k}": v for k, v in asdict(self.agent.counters).items()})
        return out

    # ---- requests -------------------------------------------------------------------------

    async def prefill(self, req: PrefillRequest) -> PrefillResponse:
        """Token 1 and, unless the request ended there, a lease on its KV blocks."""
        rid = req.request_id
        arrived = time.monotonic()
        params = checked(lambda: SamplingParams(**req.sampling.model_dump()), "sampling")
        if rid in self._inflight:
            raise bad_request(f"request id {rid!r} is already being prefilled", "request_id")
        self._counts["requests_total"] += 1
        self._inflight[rid] = False
        try:
            start = functools.partial(
                _add, rid=rid, prompt=list(req.prompt_token_ids), params=params
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
            return response
        finally:
            self._inflight.pop(rid)
            if response is None:
                self.loop.post_abort(rid)  # cancelled or failed: free whatever it holds

    def _answer(self, req: PrefillRequest, item: LoopOutput) -> PrefillResponse:
        out = item.output
        if not out.new_token_ids or self._inflight.get(req.request_id):
            raise NodeError(503, "aborted", f"request {req.request_id} was released or aborted")
        kv = None
        if out.finish_reason is FinishReason.PREFILLED:
            kv = self._lease(req.request_id, item.pinned_block_ids, out.num_prompt_tokens)
        else:
            self._counts["finished_at_first_token_total"] += 1
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
        self._counts["leases_granted_total"] += 1
        return KVHandle(
            node_id=self.info.node_id,
            peer_info=self.info.peer_info,
            block_ids=list(block_ids),
            num_tokens=num_tokens,
            layout_fingerprint=self.info.layout_fingerprint,
            lease_expires_at=time.time() + ttl,
        )

    async def release(self, request_id: str) -> bool:
        """End a request's lease, or abort its prefill when it is still computing."""
        if self.leases.release(request_id):
            self._counts["leases_released_by_router_total"] += 1
            return True
        if request_id in self._inflight:
            self._inflight[request_id] = True
            await self.loop.abort(request_id)
            return True
        return False

    def _free_lease(self, request_id: str, _block_ids: list[int]) -> None:
        """LeaseTable hook (any thread): give the blocks back in the engine thread."""
        self._counts["leases_ended_total"] += 1
        self.loop.post(lambda engine: engine.release(request_id))


async def _first_output(stream: RequestStream) -> LoopOutput:
    try:
        return await stream.get(FIRST_TOKEN_TIMEOUT_S)
    except TimeoutError:
        raise NodeError(503, "timeout", "no first token within the deadline") from None
    except EngineFailed as exc:
        raise NodeError(500, "engine_failed", str(exc)) from None


def _add(engine: LLMEngine, *, rid: str, prompt: list[int], params: SamplingParams) -> None:
    engine.add_request(rid, prompt, params)
