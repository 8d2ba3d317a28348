"""The spans of one request on a decode node, from its DecodeJob's stamps.

With a KV handle: decode.import_queue (waiting for blocks), decode.import (the READ and the
admission into the batch) holding decode.kv_transfer, decode.first_step (until token 1 of
this node). decode.import and decode.kv_transfer are open during the READ, whose TCP message
carries the transfer span's context: the prefill node's prefill.kv_send is its child.
Without a handle: decode.local_prefill. Then decode.generate: the whole decode as one span,
with its token count and preemptions."""

from __future__ import annotations

from cluster.tracing import wall_ns
from decode_node.importer import DecodeJob, PullResult


def transfer_begins(job: DecodeJob, now: float) -> None:
    """Open decode.import (since the blocks were reserved) and decode.kv_transfer in it."""
    spans = job.spans
    if not spans.on or job.reserved_at is None:
        return
    job.import_span = spans.start("decode.import", job.reserved_at, _prompt(job))
    job.transfer_span = spans.start("decode.kv_transfer", now, parent=job.import_span)


def transfer_ends(job: DecodeJob, now: float, result: PullResult, transport: str) -> None:
    if job.req.kv is not None:
        job.transfer_span.set(transfer_attrs(result, transport, job.req.kv.node_id))
    job.transfer_span.end(wall_ns(now))


def first_token(job: DecodeJob, now: float) -> None:
    """The spans up to this node's first token (at `now`)."""
    spans = job.spans
    if not spans.on:
        return
    if job.req.kv is None or job.reserved_at is None:
        spans.record("decode.local_prefill", job.arrived_at, now, _prompt(job))
        return
    committed = job.committed_at if job.committed_at is not None else now
    spans.record("decode.import_queue", job.arrived_at, job.reserved_at)
    job.import_span.end(wall_ns(committed))
    spans.record("decode.first_step", committed, now)


def finished(job: DecodeJob, now: float, finish_reason: str | None) -> None:
    """decode.generate, from this node's first token to the end."""
    if not job.spans.on or job.first_token_at is None:
        return
    attrs: dict[str, str | int | float] = {
        "splitserve.tokens": job.tokens,
        "splitserve.preemptions": job.preemptions,
        "splitserve.finish_reason": finish_reason or "none",
    }
    job.spans.record("decode.generate", job.first_token_at, now, attrs)


def closed(job: DecodeJob) -> None:
    """The stream is over: a span an abort left open ends now (an ended one stays)."""
    job.transfer_span.end()
    job.import_span.end()


def transfer_attrs(result: PullResult, transport: str, peer: str) -> dict[str, str | int | float]:
    """A READ's span attributes: what moved, over what, in which window, and how it failed."""
    attrs: dict[str, str | int | float] = {
        "splitserve.transport": transport,
        "splitserve.peer": peer,
        "splitserve.blocks": result.num_blocks,
        "splitserve.bytes": result.nbytes,
        "splitserve.pieces": result.pieces,
        "splitserve.retries": result.retries,
        "splitserve.window_ms": result.window_s * 1e3,
        "splitserve.call_ms": result.seconds * 1e3,
    }
    attrs.update(result.facts)
    if result.window_s > 0:
        attrs["splitserve.gbps"] = result.nbytes / result.window_s / 1e9
    if result.error is not None:
        attrs["splitserve.failure_kind"] = result.kind
        attrs["splitserve.error"] = result.error[:200]
    return attrs


def _prompt(job: DecodeJob) -> dict[str, str | int | float]:
    return {"splitserve.prompt_tokens": len(job.req.prompt_token_ids)}
