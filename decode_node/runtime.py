"""The decode and colocated roles: continue requests and stream their tokens.

POST /internal/generate with a KV handle (decode role): reserve blocks, pull the prefill
node's KV, admit the request into the running batch. A failed pull recomputes the prompt
here (counted) or, with transfer_failure=fail, ends the stream with an error. Without a
handle: prefill locally from prompt + the tokens given so far. Either way tokens stream as
TokenEvents until the request finishes, is aborted (POST /internal/abort, or the client
disconnects), or fails (a final event carrying `error`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping

from cluster.protocol import PROTOCOL_VERSION, DecodeRequest, TokenEvent, compatible
from decode_node import job_spans
from decode_node.events import abort_event, error_event, token_event
from decode_node.import_queue import ImportQueue
from decode_node.importer import DecodeJob, PullResult, check_handle, pull
from decode_node.kv_convert import KVConverter
from engine.engine import LLMEngine
from engine.loop.engine_loop import EngineLoop
from engine.loop.stream import EngineFailed, RequestStream, StreamOutput
from engine.scheduler.plan import ImportPlan
from kv_transfer import KVTransferAgent
from node.core import NodeCore
from node.errors import NodeError, bad_request, checked_async
from node.metrics import NodeMetrics
from node.settings import NodeSettings
from node.spans import NodeSpans

log = logging.getLogger("splitserve.decode")

Events = AsyncGenerator[TokenEvent, None]
STREAM_IDLE_TIMEOUT_S = 120.0  # no token for this long ends the stream with an error


class DecodeRuntime(NodeCore):
    """A decode (or colocated) node: the node core with the reader side of the transfer
    agent (none on a colocated node) and the running streams."""

    def __init__(
        self, settings: NodeSettings, loop: EngineLoop, started_at: float, metrics: NodeMetrics
    ) -> None:
        super().__init__(settings, loop, started_at, metrics)
        self._jobs: dict[str, DecodeJob] = {}
        self._kv_converter: KVConverter | None = None
        max_waiting = settings.max_queued_imports or loop.engine.config.max_num_seqs
        self.imports = ImportQueue(loop, max_waiting, settings.import_wait_s)

    def _moves_kv(self) -> bool:
        return self.settings.role == "decode"

    def _max_queued(self) -> int:
        return self.imports.max_waiting

    # ---- requests -------------------------------------------------------------------------

    async def generate(
        self, req: DecodeRequest, headers: Mapping[str, str] | None = None
    ) -> tuple[Events, Callable[[], None]]:
        """Checks and reservations that may still refuse the request (NodeError), then the
        event stream and its cleanup, to call once the stream is over or was never read.
        `headers`: the call's, whose trace context makes this node's spans the caller's
        children."""
        rid = req.request_id
        self._check(req)
        job = DecodeJob(req, spans=NodeSpans(self.tracer, headers))
        if rid in self._jobs:
            raise bad_request(f"request id {rid!r} is already being generated", "request_id")
        job.lora = await self.adapters.resolve(req.lora)
        self.counts["requests_total"] += 1
        self._jobs[rid] = job
        try:
            if req.kv is None:
                stream = await self._open_local(job)
                events = self._relay(job, stream, cached=None, hits=None)
            else:
                events = self._import(job, await self._reserve(job))
        except BaseException:
            self._jobs.pop(rid, None)
            raise
        self.metrics.prompt_tokens.inc(len(req.prompt_token_ids))
        return self._events(job, events), functools.partial(self._close, job)

    def _check(self, req: DecodeRequest) -> None:
        if len(req.output_token_ids) >= req.sampling.max_tokens:
            raise bad_request("output_token_ids already hold max_tokens tokens", "sampling")
        if req.kv is not None and self.settings.role != "decode":
            raise bad_request("a colocated node takes no KV handle; send kv=null", "kv")
        if req.kv is not None and not req.output_token_ids:
            raise bad_request("a KV handle comes with the first token", "output_token_ids")
        if req.kv is not None and not compatible(req.kv.protocol_version, PROTOCOL_VERSION):
            raise bad_request(
                f"the KV handle's protocol version {req.kv.protocol_version} is more than one "
                f"version from this node's {PROTOCOL_VERSION}",
                "kv.protocol_version",
            )

    async def _reserve(self, job: DecodeJob) -> ImportPlan:
        kv = job.kv
        if (
            kv.layout_fingerprint != self.info.layout_fingerprint
            and self._converter().layout_of(kv.layout_fingerprint) is None
        ):
            raise bad_request(
                f"KV layout {kv.layout_fingerprint} differs from this node's "
                f"{self.info.layout_fingerprint} ({self.info.layout}) beyond the KV dtype",
                "kv.layout_fingerprint",
            )
        num_kv_tokens = len(job.req.prompt_token_ids) + len(job.req.output_token_ids) - 1
        lora = job.req.lora.name if job.req.lora is not None else None
        check_handle(kv, num_kv_tokens, self.loop.engine.config.block_size, lora)
        plan = await self.imports.reserve(job)
        job.reserved_at = time.monotonic()
        return plan

    async def _open_local(self, job: DecodeJob) -> RequestStream:
        """Prefill prompt + the tokens so far here; generate the rest of max_tokens."""
        req = job.req
        prompt = list(req.prompt_token_ids) + list(req.output_token_ids)
        params = dataclasses.replace(
            job.params, max_tokens=job.params.max_tokens - len(req.output_token_ids)
        )
        self.counts["local_prefills_total"] += 1

        def add(engine: LLMEngine) -> None:
            engine.add_request(
                req.request_id, prompt, params, req.priority, req.output_token_ids, job.lora
            )

        return await checked_async(self.loop.open(req.request_id, add), "prompt_token_ids")

    async def _import(self, job: DecodeJob, plan: ImportPlan) -> AsyncIterator[TokenEvent]:
        rid = job.req.request_id
        foreign = self._converter().layout_of(job.kv.layout_fingerprint)
        job_spans.transfer_begins(job, time.monotonic())
        if foreign is None:
            result = await pull(self._require_agent(), job, plan)
        else:  # the prefill node's KV dtype differs: staged read, converted here
            result = await self._converter().pull(job, plan, foreign)
        job_spans.transfer_ends(job, time.monotonic(), result, self._transport())
        if job.aborted or result.aborted:
            await self.loop.abort(rid)
            yield abort_event()
            return
        if result.error is None:
            result = await self._check_state(rid, result)
        if result.error is None:
            self._count_import(job, result)
            try:
                stream = await self.loop.open(rid, lambda engine: engine.commit_import(rid))
            except EngineFailed as exc:  # the engine stopped during the READ
                yield error_event("engine_failed", str(exc))
                return
            job.committed_at = time.monotonic()
        else:
            await self.loop.abort(rid)  # frees the reserved blocks
            self.counts["transfer_failures_total"] += 1
            self.metrics.transfer_failed(result.kind)
            log.warning("transfer_failed id=%s error=%s", rid, result.error)
            if self.settings.transfer_failure == "fail":
                yield error_event("transfer_failed", result.error)
                return
            self.counts["recomputes_total"] += 1
            self.metrics.recomputed(result.kind)
            try:
                stream = await self._open_local(job)
            except NodeError as exc:
                yield error_event(exc.info.code, exc.info.message)
                return
        num_prompt = len(job.req.prompt_token_ids)
        cached = num_prompt if result.error is None else None
        hits = min(plan.num_cached_tokens, num_prompt) if result.error is None else None
        async for event in self._relay(job, stream, cached, hits):
            yield event

    async def _check_state(self, rid: str, result: PullResult) -> PullResult:
        """A hybrid model's state record, read with the blocks, into the request's slot; a
        refused one (corrupt, foreign, missing) fails the import: recomputed, never decoded."""
        why = await self.loop.call(lambda engine: engine.load_imported_state(rid))
        if why is None:
            return result
        return dataclasses.replace(result, error=f"state refused: {why}", kind="refused")

    def _count_import(self, job: DecodeJob, result: PullResult) -> None:
        self.counts["imports_total"] += 1
        self.counts["imported_blocks_total"] += result.num_blocks
        self.metrics.transfer_seconds.observe(result.seconds)
        self.metrics.transfer_bytes.inc(result.nbytes)
        peer, window = job.kv.node_id, result.window_s
        self.metrics.transfer_done(self._transport(), peer, result.nbytes, window)

    async def _relay(
        self, job: DecodeJob, stream: RequestStream, cached: int | None, hits: int | None
    ) -> AsyncIterator[TokenEvent]:
        """The request's outputs as events, several tokens per event when they queued up.
        `cached`: prompt tokens this node did not compute; `hits`: of those, the ones its own
        prefix cache held (None: as the engine reports)."""
        num_prompt = len(job.req.prompt_token_ids)
        with_logprobs = job.params.logprobs is not None
        while True:
            try:
                items = [await stream.get(STREAM_IDLE_TIMEOUT_S)]
            except TimeoutError:
                yield error_event("stalled", f"no token in {STREAM_IDLE_TIMEOUT_S:.0f}s")
                return
            except EngineFailed as exc:
                yield error_event("engine_failed", str(exc))
                return
            items += _queued(stream, items[-1])
            job.preemptions = items[-1].preemptions
            if job.first_token_at is None and items[0].scheduled_at is not None:
                self.metrics.queue_time.observe(max(items[0].scheduled_at - job.arrived_at, 0))
            if cached is None:
                cached = min(items[0].output.num_cached_tokens, num_prompt)
            if hits is None:
                hits = min(items[0].output.num_cached_tokens, num_prompt)
            event = token_event(items, num_prompt, cached, with_logprobs, hits)
            yield event
            if event.finished:
                return

    async def _events(
        self, job: DecodeJob, events: AsyncIterator[TokenEvent]
    ) -> AsyncGenerator[TokenEvent, None]:
        async for event in events:
            job.ended = event.finished and event.error is None
            self._observe(job, event)
            yield event

    def _observe(self, job: DecodeJob, event: TokenEvent) -> None:
        now = time.monotonic()
        job.tokens += len(event.token_ids)
        if event.token_ids and job.first_token_at is None:
            job.first_token_at = now
            self.metrics.ttft.observe(now - job.arrived_at)
            job_spans.first_token(job, now)
        if job.ended and event.finish_reason != "abort":
            self.metrics.e2e.observe(now - job.arrived_at)
        if event.finished:
            job_spans.finished(job, now, event.finish_reason)

    def _transport(self) -> str:
        return self.agent.transport.kind.value if self.agent is not None else "none"

    def _close(self, job: DecodeJob) -> None:
        """After the stream: a request that did not end cleanly (client gone, stalled) is
        aborted and its blocks freed; a READ in flight has stopped by then."""
        rid = job.req.request_id
        job_spans.closed(job)
        if self._jobs.get(rid) is job:
            del self._jobs[rid]
        if not job.ended:
            self.counts["streams_cut_total"] += 1
            self.loop.post_abort(rid)

    async def abort(self, request_id: str) -> bool:
        """Stop a request: cancel its READ if one runs (its blocks are freed once it has
        stopped), else abort it in the engine."""
        job = self._jobs.get(request_id)
        if job is not None:
            job.aborted = True
            self.counts["aborts_total"] += 1
            if job.transfer is not None and not job.transfer.done():
                job.transfer.cancel()
                return True
        return await self.loop.abort(request_id) or job is not None

    def _import_fingerprints(self) -> list[str]:
        return self._converter().foreign_fingerprints() if self._moves_kv() else []

    def _converter(self) -> KVConverter:
        if self._kv_converter is None:
            runner = self.loop.engine.runner
            max_blocks = -(-runner.max_model_len // runner.layout.block_size)
            self._kv_converter = KVConverter(
                self._require_agent(), runner.kv_cache, runner.layout, max_blocks
            )
        return self._kv_converter

    def _require_agent(self) -> KVTransferAgent:
        if self.agent is None:
            raise bad_request("this node has no KV transfer agent", "kv")
        return self.agent


def _queued(stream: RequestStream, last: StreamOutput) -> list[StreamOutput]:
    """Outputs already delivered after `last`, up to the final one."""
    more: list[StreamOutput] = []
    while not last.output.finished and (item := stream.get_nowait()) is not None:
        more.append(item)
        last = item
    return more
