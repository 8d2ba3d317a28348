"""A hybrid model's linear-attention states as the runner keeps them on a rank: the pool of
per-request slots (``engine.kv.linear_state``), the host swap space of preempted requests
(``engine.kv.state_swap``) and the checkpoints that make prefix-cache hits exact
(``engine.kv.state_checkpoints``; their bookkeeping counts on rank 0 only). Each step it
says where every sequence's state starts and which checkpoints its chunk writes."""

from __future__ import annotations

import dataclasses

import torch

from engine.config import EngineConfig, checkpoint_slots
from engine.kv.linear_state import StatePool, placement
from engine.kv.sizing import SharedCache
from engine.kv.state_checkpoints import ChunkCheckpoints, ChunkSpan, StateCheckpoints
from engine.kv.state_swap import StateSwap
from engine.model.attention import LinearStates
from engine.model.config import ModelConfig
from engine.model.shard import Shard
from engine.model.specs import LinearAttnSpec
from engine.scheduler.plan import ScheduledChunk, SchedulerOutput


class HybridStates:
    """The pool, its swap space (None: no host tier) and its checkpoints (None: off)."""

    def __init__(
        self,
        pool: StatePool,
        swap: StateSwap | None,
        checkpoints: StateCheckpoints | None,
    ) -> None:
        self.pool, self.swap, self.checkpoints = pool, swap, checkpoints
        # the checkpoints' states: [checkpoints, layers, ...] as the pool's slots
        self.saved = pool.more(checkpoints.capacity) if checkpoints is not None else None

    def step(self, out: SchedulerOutput) -> LinearStates:
        """The states of a step's sequences (decodes, then prefill chunks): a chunk at
        position 0 starts from zeros, one past it of a request without a slot from its
        swapped copy or a checkpoint (a prefix hit), the others as they were."""
        chunks = out.prefills
        moves = self._checkpoint_moves(out)
        for chunk, move in zip(chunks, moves, strict=True):
            self._resume(chunk, move.load is not None)
        ids = [*(r.request_id for r in out.decodes), *(c.request_id for c in chunks)]
        fresh = [False] * len(out.decodes) + [c.start == 0 for c in chunks]
        states = self.pool.step(ids, fresh)
        if all(m == ChunkCheckpoints() for m in moves):
            return states
        decodes = len(out.decodes)
        return dataclasses.replace(
            states,
            checkpoints=self.saved,
            loads=(None,) * decodes + tuple(m.load for m in moves),
            saves=((),) * decodes + tuple(m.saves for m in moves),
        )

    def release(self, request_id: str) -> None:
        """The request left the running batch: its slot back (its states first copied to
        the swap space when it was preempted by swapping; a copy dropped when it finished
        or was aborted), its checkpoint claims and unpublished saves dropped."""
        pool, swap = self.pool, self.swap
        if swap is not None and swap.awaits_copy(request_id) and pool.holds(request_id):
            slot = pool.slot(request_id)
            swap.put(request_id, pool.conv[slot], pool.recurrent[slot])
        elif swap is not None:
            swap.release(request_id)
        pool.release(request_id)
        if self.checkpoints is not None:
            self.checkpoints.release(request_id)

    def publish(self, out: SchedulerOutput) -> None:
        """The step ran: the checkpoints it wrote can be read."""
        if self.checkpoints is not None:
            self.checkpoints.publish(out)

    def _checkpoint_moves(self, out: SchedulerOutput) -> list[ChunkCheckpoints]:
        chunks, requests = out.prefills, out.prefill_requests
        if self.checkpoints is None:
            return [ChunkCheckpoints()] * len(chunks)
        spans = [
            ChunkSpan(c.request_id, r.all_token_ids, r.hash_root, c.start, c.context_len)
            for c, r in zip(chunks, requests, strict=True)
        ]
        return self.checkpoints.plan(out, spans)

    def _resume(self, chunk: ScheduledChunk, from_checkpoint: bool) -> None:
        """A chunk past position 0 of a request without a slot: a slot now, its states back
        from the swap space (or, from a checkpoint, copied in the forward)."""
        pool, rid = self.pool, chunk.request_id
        if chunk.start == 0 or pool.holds(rid):
            return
        if from_checkpoint:
            pool.slot(rid)
            return
        if self.swap is None or not self.swap.holds_copy(rid):
            raise RuntimeError(f"request {rid} resumes at {chunk.start} with no state")
        conv, recurrent = self.swap.take(rid)
        slot = pool.slot(rid)
        pool.conv[slot].copy_(conv)
        pool.recurrent[slot].copy_(recurrent)


def state_caches(config: EngineConfig, local: LinearAttnSpec) -> tuple[SharedCache, ...]:
    """The state pool and its checkpoints (of a rank's ``local`` spec) as fixed shares of
    the KV budget."""
    dtype, saved = config.torch_dtype, checkpoint_slots(config)
    pool = StatePool.cache(local, config.max_num_seqs, dtype)
    if not saved:
        return (pool,)
    return pool, StatePool.cache(local, saved, dtype, "state_checkpoints")


def hybrid_states(
    config: EngineConfig, model_config: ModelConfig, shard: Shard | None, device: torch.device
) -> HybridStates:
    """A rank's states of a hybrid model: ``max_num_seqs`` slots, as many in the swap space
    with a host tier, ``checkpoint_slots(config)`` checkpoints."""
    assert model_config.linear is not None
    place = placement(model_config, shard or Shard())
    seqs, dtype = config.max_num_seqs, config.torch_dtype
    pool = StatePool(model_config.linear, seqs, dtype, device, place)
    swap = StateSwap(seqs) if config.kv_offload_cpu_gb is not None else None
    saved = checkpoint_slots(config)
    book = StateCheckpoints(saved, config.block_size) if saved else None
    return HybridStates(pool, swap, book)


def state_counts(hybrid: HybridStates | None) -> dict[str, int]:
    """``EngineStats``' counts of a hybrid model's states (zeros for any other model)."""
    if hybrid is None:
        return dict.fromkeys(
            ("free_state_slots", "total_state_slots", "swapped_states", "state_checkpoints"), 0
        )
    book = hybrid.checkpoints
    return {
        "free_state_slots": hybrid.pool.num_free,
        "total_state_slots": hybrid.pool.num_slots,
        "swapped_states": hybrid.swap.num_used if hybrid.swap is not None else 0,
        "state_checkpoints": book.num_used if book is not None else 0,
    }
