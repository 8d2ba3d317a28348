"""Checkpoints of a hybrid model's linear-attention states at block boundaries: what makes a
prefix-cache hit exact for a model whose layers carry a per-request state
(``engine.kv.linear_state``). This is their bookkeeping, integers only, on rank 0; the
states themselves lie in checkpoint slots beside the state pool on every rank (each its
key heads' share, under rank 0's slot numbers), written and read inside the forward
(``engine.model.gated_delta``).

A checkpoint holds every linear layer's conv and recurrent state after the first ``B``
tokens of a sequence, ``B`` a multiple of the block size, under the chained hash of the
block that ends at ``B`` (``models.block_hash``, the prefix cache's) with those ``B`` token
ids, so a hash collision is a miss. A prefill chunk saves one where it passes:

- the last block boundary before its sequence's last token (``(n - 1) // block * block``:
  the point a later prompt that repeats this one, or continues it, can resume from);
- the boundary where its prompt left the cached prefix at admission (its matched blocks
  had no checkpoint at their end): where the next prompt that shares that prefix branches.

A save is pending until its step has run (``publish``); a request that leaves first, or a
step that failed, gives its slot back unpublished, so no checkpoint claims a state it does
not hold. Slots are reused least recently used first (a hit or a save uses one), never one
a step is about to read. At admission a prompt whose first ``k`` blocks are cached resumes
from the checkpoint at the end of the longest ``j <= k`` of them that has one (``find``),
the blocks past ``j`` recomputed; without one it is computed whole.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from models.block_hash import prefix_block_hashes

MAX_UNPUBLISHED = 4  # steps planned and not yet published (one or two in flight in practice)


class CheckpointHit(NamedTuple):
    """A prompt's leading blocks whose end has a checkpoint, its slot and its key."""

    num_blocks: int
    slot: int
    key: int


class ChunkSpan(NamedTuple):
    """A prefill chunk as the checkpoints see it: its sequence's tokens (known so far), the
    chain's root (``BlockOwner.hash_root``) and the positions it computes."""

    request_id: str
    token_ids: Sequence[int]
    root: int | None
    start: int
    end: int


class ChunkCheckpoints(NamedTuple):
    """One chunk's checkpoint moves: the slot it starts from (None: none) and the (offset in
    the chunk, slot) pairs it saves, in order."""

    load: int | None = None
    saves: tuple[tuple[int, int], ...] = ()


@dataclass
class _Claim:
    load: int | None  # the slot its first chunk starts from, held until planned
    branch: int  # the token boundary to save at where its prompt leaves the cache (0: none)


@dataclass(frozen=True)
class _Save:
    step: object  # the step (its SchedulerOutput) that writes it
    request_id: str
    slot: int
    key: int
    tokens: array


@dataclass
class CheckpointTotals:
    saves: int = 0  # checkpoints published
    hits: int = 0  # chunks that started from one
    evictions: int = 0  # published ones dropped for room


class StateCheckpoints:
    """``capacity`` checkpoint slots of a hybrid model's states, by prefix."""

    def __init__(self, capacity: int, block_size: int) -> None:
        if capacity < 1:
            raise ValueError(f"StateCheckpoints needs a capacity >= 1, got {capacity}")
        self.capacity, self._block_size = capacity, block_size
        self._free = list(range(capacity - 1, -1, -1))
        self._entries: OrderedDict[int, tuple[int, array]] = OrderedDict()  # key -> slot, ids
        self._claims: dict[str, _Claim] = {}
        self._held: dict[int, int] = {}  # slot -> claims about to read it
        self._pending: list[_Save] = []
        self._steps: list[object] = []  # planned, not yet published, in order
        self.totals = CheckpointTotals()

    @property
    def num_used(self) -> int:
        """Slots holding a checkpoint or a pending save."""
        return self.capacity - len(self._free)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    # ---- admission (the scheduler) --------------------------------------------------------

    def find(
        self, token_ids: Sequence[int], root: int | None, num_blocks: int
    ) -> CheckpointHit | None:
        """The most of the first ``num_blocks`` blocks of ``token_ids`` (cached ones) whose end
        has a checkpoint; None: none has."""
        if not num_blocks or not self._entries:
            return None
        size = self._block_size
        hashes = prefix_block_hashes(token_ids[: num_blocks * size], size, root)
        for j in range(num_blocks, 0, -1):
            entry = self._entries.get(hashes[j - 1])
            if entry is not None and entry[1] == array("q", token_ids[: j * size]):
                return CheckpointHit(j, entry[0], hashes[j - 1])
        return None

    def claim(self, request_id: str, hit: CheckpointHit | None, matched_blocks: int) -> None:
        """The request was admitted: its first chunk starts from ``hit`` (held until then);
        a prompt that matched more cached blocks than the hit covers saves a checkpoint
        where the match ended."""
        self._drop_claim(request_id)
        hit_blocks = hit.num_blocks if hit is not None else 0
        branch = matched_blocks * self._block_size if matched_blocks > hit_blocks else 0
        if hit is None and not branch:
            return
        load = None
        if hit is not None:
            load = hit.slot
            self._held[load] = self._held.get(load, 0) + 1
            self._entries.move_to_end(hit.key)
        self._claims[request_id] = _Claim(load, branch)

    # ---- the step (the runner) ------------------------------------------------------------

    def plan(self, step: object, chunks: Sequence[ChunkSpan]) -> list[ChunkCheckpoints]:
        """Each prefill chunk's loads and saves in ``step``: the saves' slots are taken now
        (pending until ``publish(step)``), never one a chunk of the step reads."""
        self._steps.append(step)
        if len(self._steps) > MAX_UNPUBLISHED:
            self._lose(self._steps.pop(0))
        loads = [self._take_load(c) for c in chunks]
        saves = [self._saves(step, c) for c in chunks]
        out = [ChunkCheckpoints(*moves) for moves in zip(loads, saves, strict=True)]
        for load in loads:
            if load is not None:
                self._unhold(load)
        return out

    def publish(self, step: object) -> None:
        """``step`` ran: its saves become checkpoints. Saves of steps planned before it that
        never ran to the end (a failed step) are dropped."""
        index = next((i for i, s in enumerate(self._steps) if s is step), None)
        if index is None:
            return
        for lost in self._steps[:index]:
            self._lose(lost)
        self._steps = self._steps[index + 1 :]
        mine = [s for s in self._pending if s.step is step]
        self._pending = [s for s in self._pending if s.step is not step]
        for save in mine:
            if save.key in self._entries:  # another request saved the same prefix first
                self._free.append(save.slot)
                continue
            self._entries[save.key] = (save.slot, save.tokens)
            self.totals.saves += 1

    def release(self, request_id: str) -> None:
        """The request left the batch: its claim and unpublished saves dropped."""
        self._drop_claim(request_id)
        kept = [s for s in self._pending if s.request_id != request_id]
        self._free.extend(s.slot for s in self._pending if s.request_id == request_id)
        self._pending = kept

    # ---- internals ------------------------------------------------------------------------

    def _take_load(self, chunk: ChunkSpan) -> int | None:
        claim = self._claims.get(chunk.request_id)
        if claim is None or claim.load is None or chunk.start == 0:
            return None
        load, claim.load = claim.load, None
        self.totals.hits += 1
        return load

    def _saves(self, step: object, chunk: ChunkSpan) -> tuple[tuple[int, int], ...]:
        size, tokens = self._block_size, chunk.token_ids
        claim = self._claims.get(chunk.request_id)
        bounds = {(len(tokens) - 1) // size * size}
        if claim is not None and claim.branch:
            bounds.add(claim.branch)
            if chunk.end >= claim.branch:
                claim.branch = 0
        saves: list[tuple[int, int]] = []
        for bound in sorted(b for b in bounds if chunk.start < b <= chunk.end):
            slot = self._reserve(step, chunk, bound)
            if slot is not None:
                saves.append((bound - chunk.start, slot))
        return tuple(saves)

    def _reserve(self, step: object, chunk: ChunkSpan, bound: int) -> int | None:
        """A slot for the state after ``bound`` tokens (None: saved already, or no room)."""
        key = prefix_block_hashes(chunk.token_ids[:bound], self._block_size, chunk.root)[-1]
        if key in self._entries:
            self._entries.move_to_end(key)
            return None
        slot = self._take()
        if slot is not None:
            ids = array("q", chunk.token_ids[:bound])
            self._pending.append(_Save(step, chunk.request_id, slot, key, ids))
        return slot

    def _take(self) -> int | None:
        if self._free:
            return self._free.pop()
        for key, (slot, _) in self._entries.items():  # oldest first
            if slot not in self._held:
                del self._entries[key]
                self.totals.evictions += 1
                return slot
        return None

    def _unhold(self, slot: int) -> None:
        self._held[slot] -= 1
        if not self._held[slot]:
            del self._held[slot]

    def _lose(self, step: object) -> None:
        """A step that will never be published: its saves' slots back."""
        self._free.extend(s.slot for s in self._pending if s.step is step)
        self._pending = [s for s in self._pending if s.step is not step]

    def _drop_claim(self, request_id: str) -> None:
        claim = self._claims.pop(request_id, None)
        if claim is not None and claim.load is not None:
            self._unhold(claim.load)

    def stats(self) -> CheckpointTotals:
        return dataclasses.replace(self.totals)
