"""Decode role: take over a request prefilled elsewhere.

1. Reserve: the engine reserves blocks for prompt + given tokens; while the cache or the
   batch is full the request waits in the node's ImportQueue (decode_node.import_queue).
2. `pull`: read the prefill node's blocks that the local prefix cache lacks, within the
   transfer deadline and the lease: one READ when each side is one rank; when either side
   has several (TP x PP), the reads of every (layer, head) piece posted at once (NIXL: one
   per remote agent; TCP: one per rank pair). Reads that complete tell the prefill node to end
   the lease; when the local cache holds every block, a release notice alone ends it. While
   the reads run, their blocks stay reserved: an abort cancels them first.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from cluster.protocol import DecodeRequest, KVHandle
from cluster.tracing import Span
from engine.lora.request import LoRARequest
from engine.scheduler.plan import ImportPlan
from kv_transfer import (
    Facts,
    KVTransferAgent,
    LayoutMismatch,
    PeerInfo,
    PeerUnavailable,
    TransferError,
    TransferRefused,
    TransferResult,
    TransferTimeout,
)
from models.sampling_params import SamplingParams
from node.errors import NodeError
from node.spans import NodeSpans

LEASE_MARGIN_S = 0.5  # a READ must end this long before the lease expires


@dataclass
class DecodeJob:
    """One /internal/generate request. `aborted`: POST /internal/abort came; `ended`: the
    stream sent its final event. `arrived_at` / `first_token_at`: time.monotonic() stamps
    for the latency metrics."""

    req: DecodeRequest
    transfer: asyncio.Task[TransferResult] | None = None
    aborted: bool = False
    ended: bool = False
    arrived_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    lora: LoRARequest | None = None  # the adapter it runs under, as this node's engine knows it
    spans: NodeSpans = field(default_factory=NodeSpans)
    # the import, for its spans: when the blocks were reserved and the request admitted into
    # the batch (time.monotonic()); decode.import and decode.kv_transfer, open during the READ
    reserved_at: float | None = None
    committed_at: float | None = None
    import_span: Span = field(default_factory=Span)
    transfer_span: Span = field(default_factory=Span)
    tokens: int = 0
    preemptions: int = 0

    @property
    def params(self) -> SamplingParams:
        return self.req.sampling

    @property
    def kv(self) -> KVHandle:
        if self.req.kv is None:
            raise ValueError(f"request {self.req.request_id} carries no KV handle")
        return self.req.kv


@dataclass(frozen=True)
class PullResult:
    """How a pull ended: `error` is None on success; then `kind` says what failed
    (timeout, peer, layout or other, the metric's label)."""

    error: str | None = None
    aborted: bool = False
    num_blocks: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    kind: str = "other"
    window_s: float = 0.0  # the READ as the node waited for it (TransferResult)
    pieces: int = 0
    retries: int = 0
    facts: Facts = field(default_factory=dict)  # what the transport library reported


def transfer_pairs(plan: ImportPlan, remote_blocks: list[int]) -> tuple[list[int], list[int]]:
    """(remote, local) block ids to copy, pairwise: the blocks the local prefix cache lacks
    (none when it holds them all), then a hybrid model's state record (the last blocks of
    each side's table)."""
    fill = list(plan.fill_block_ids)
    first = plan.num_cached_blocks
    remote, local = remote_blocks[first : first + len(fill)], fill
    n = plan.num_state_blocks
    if n and len(remote_blocks) >= n:
        remote, local = remote + remote_blocks[-n:], local + list(plan.block_ids[-n:])
    return remote, local


def check_handle(
    kv: KVHandle, num_kv_tokens: int, block_size: int, lora_name: str | None = None
) -> None:
    """400 unless the handle holds the KV of exactly `num_kv_tokens` tokens, computed under
    the adapter the request decodes with (`lora_name`; None: the base model)."""
    if kv.lora_name != lora_name:
        raise NodeError(
            400,
            "bad_request",
            f"the KV handle was computed under adapter {kv.lora_name or 'none (base model)'}, "
            f"the request decodes under {lora_name or 'none (base model)'}",
            "kv.lora_name",
        )
    if kv.num_tokens != num_kv_tokens:
        raise NodeError(
            400,
            "bad_request",
            f"the KV handle holds {kv.num_tokens} tokens; prompt + output_token_ids "
            f"need {num_kv_tokens}",
            "kv.num_tokens",
        )
    if len(kv.block_ids) < -(-num_kv_tokens // block_size):
        raise NodeError(
            400, "bad_request", "the KV handle has too few blocks for its tokens", "kv.block_ids"
        )


async def pull(agent: KVTransferAgent, job: DecodeJob, plan: ImportPlan) -> PullResult:
    """Copy the remote blocks into the plan's blocks. Never raises for a failed transfer."""
    kv = job.kv
    try:
        peer = PeerInfo.from_json(kv.peer_info)
    except ValueError as exc:
        return PullResult(f"unreadable peer info: {exc}", kind="peer")
    left = kv.lease_expires_at - time.time() - LEASE_MARGIN_S
    if left <= 0:
        return PullResult("the KV lease has expired", kind="timeout")
    if job.aborted:
        return PullResult(aborted=True)
    remote, local = transfer_pairs(plan, list(kv.block_ids))
    rid, deadline_s = job.req.request_id, min(agent.config.deadline_s, left)
    if local:
        trace = job.transfer_span.headers()  # the owner's span joins this trace (TCP)
        read = agent.read_blocks(
            peer, remote, local, request_id=rid, deadline_s=deadline_s, trace=trace
        )
    else:
        read = _release_only(agent, peer, rid, deadline_s)
    job.transfer = asyncio.create_task(read)
    try:
        moved = await job.transfer
    except (TransferError, ValueError) as exc:
        return PullResult(f"{type(exc).__name__}: {exc}", kind=failure_kind(exc))
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if job.aborted and current is not None and current.cancelling() == 0:
            return PullResult(aborted=True)
        raise
    return PullResult(
        aborted=job.aborted, num_blocks=len(local), nbytes=moved.nbytes, seconds=moved.seconds,
        window_s=moved.window_s, pieces=moved.pieces, retries=moved.retries, facts=moved.facts,
    )  # fmt: skip


async def _release_only(
    agent: KVTransferAgent, peer: PeerInfo, request_id: str, deadline_s: float
) -> TransferResult:
    """Every block is cached here: end the prefill node's lease without reading."""
    await agent.release(peer, request_id, deadline_s=deadline_s)
    return TransferResult(0, 0.0)


def failure_kind(exc: Exception) -> str:
    """The metric label of a failed transfer."""
    if isinstance(exc, TransferTimeout):
        return "timeout"
    if isinstance(exc, PeerUnavailable):
        return "peer"
    if isinstance(exc, LayoutMismatch):
        return "layout"
    if isinstance(exc, TransferRefused):
        return "refused"
    return "other"
