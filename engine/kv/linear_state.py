"""The state cache of a hybrid model's linear-attention layers, beside the paged KV cache.

A Gated DeltaNet layer (``engine.model.gated_delta``) keeps no KV blocks: each request
carries a conv state and a recurrent state per such layer. They live in a fixed pool of
slots allocated at start (as many as requests may run at once, ``max_num_seqs``; their
bytes come off the KV cache's budget, ``engine.kv.sizing.SharedCache``). A request takes a
slot at its first step and gives it back when it leaves the running batch (finished,
aborted, preempted: a preempted request is recomputed from its first token, its state
rebuilt from zeros). A chunk at position 0 starts from zeros, later chunks and decodes from
what the request's previous step left; the first chunk of a prompt found in the prefix cache
from a checkpoint of the states (``engine.kv.state_checkpoints``, slots of the same shape).
With tensor parallelism each rank's pool holds its key heads' share of every slot (the slot
numbers are rank 0's, the same on every rank).
The prefill role ships a request's states in KV blocks (``engine.kv.state_record``).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist

from engine.kv.sizing import SharedCache
from engine.kv.state_record import StateShare, read_record, write_record
from engine.model.attention import LinearStates, StateTensors
from engine.model.config import ModelConfig
from engine.model.shard import Shard, Span
from engine.model.specs import LinearAttnSpec


class Placement(NamedTuple):
    """What a rank's pool holds of the model's: its key heads (None: all) and its KV heads
    (the record's units, ``engine.kv.state_record``)."""

    k_heads: Span | None = None
    kv_heads: Span = Span(0, 1)
    num_kv_heads: int = 1


def placement(config: ModelConfig, shard: Shard) -> Placement:
    """The key heads and KV heads a rank of ``shard`` holds of the model's."""
    assert config.linear is not None
    if shard.size == 1:
        return Placement(None, Span(0, config.num_key_value_heads), config.num_key_value_heads)
    kv = shard.heads(config.num_attention_heads, config.num_key_value_heads)[1]
    k = shard.linear_heads(config.linear.num_k_heads)
    return Placement(k, kv, config.num_key_value_heads)


class StatePool:
    """``slots`` per-request states of every linear-attention layer, on one device: the
    key heads ``place`` names of the model's ``spec``."""

    def __init__(
        self,
        spec: LinearAttnSpec,
        slots: int,
        dtype: torch.dtype,
        device: torch.device,
        place: Placement | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError(f"StatePool needs at least one slot, got {slots}")
        place = place or Placement()
        k = place.k_heads or Span(0, spec.num_k_heads)
        self.spec = local_spec(spec, k.length)
        self.conv, self.recurrent = self.more(slots, dtype, device)
        self.num_slots = slots
        self.shape_crc = zlib.crc32(f"{spec.describe()}|{dtype}".encode())
        group = slot_bytes(local_spec(spec, 1), dtype)  # one key head's group, every layer
        kv = place.kv_heads
        self.share = StateShare(
            spec.num_k_heads * group, k.start * group, k.length * group, kv.start, kv.length,
            place.num_kv_heads,
        )  # fmt: skip
        # a KV head over several ranks (tensor parallelism past the KV heads): each holds a
        # part of its head's unit, and every replica writes the whole unit (``whole_unit``)
        self.replicated = k.length * place.num_kv_heads < spec.num_k_heads
        self._slots: dict[str, int] = {}
        self._free = list(range(slots - 1, -1, -1))

    @staticmethod
    def cache(
        spec: LinearAttnSpec, slots: int, dtype: torch.dtype, name: str = "linear_state"
    ) -> SharedCache:
        """The pool (of a rank's ``spec``) as a fixed share of the KV budget."""
        return SharedCache(name, 0, fixed_bytes=slots * slot_bytes(spec, dtype))

    def more(
        self, slots: int, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> StateTensors:
        """Zero states of ``slots`` slots shaped as this pool's (its checkpoints')."""
        dtype = dtype or self.conv.dtype
        device = device or self.conv.device
        local, layers = self.spec, len(self.spec.layers)
        # conv: [slots, layers, conv_dim, kernel - 1] in the model dtype;
        # recurrent: [slots, layers, v_heads, k_dim, v_dim] fp32
        conv = torch.zeros(slots, layers, *local.conv_state_shape, dtype=dtype, device=device)
        return StateTensors(conv, torch.zeros(slots, layers, *local.recurrent_shape, device=device))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def slot(self, request_id: str) -> int:
        """The request's slot (taken now if it has none)."""
        slot = self._slots.get(request_id)
        if slot is None:
            if not self._free:
                raise RuntimeError("the linear-attention state pool is full (max_num_seqs)")
            slot = self._slots[request_id] = self._free.pop()
        return slot

    def release(self, request_id: str) -> None:
        """Give the request's slot back (no-op when it holds none)."""
        slot = self._slots.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)

    def holds(self, request_id: str) -> bool:
        return request_id in self._slots

    def step(self, request_ids: Sequence[str], fresh: Sequence[bool]) -> LinearStates:
        """The states of a step's sequences (in step order); ``fresh``: those that start
        from zeros (their chunk begins at position 0)."""
        return LinearStates(
            self.conv, self.recurrent, tuple(map(self.slot, request_ids)), tuple(fresh)
        )

    def record_blocks(self, cell_bytes: int) -> int:
        """KV blocks a request's state record takes (the same on every rank and pool);
        ``cell_bytes``: one KV head's bytes of a block."""
        return self.share.record_blocks(cell_bytes)

    def save(self, slot: int, request_id: str, blocks: Sequence[int], kv: torch.Tensor) -> bool:
        """Write this rank's share of the states in ``slot`` into ``blocks`` of the KV cache
        (the prefill role ships them with the prompt's blocks). False when they do not fit."""
        self._check_blocks(blocks, kv)
        data = pack(self.spec, self.conv[slot], self.recurrent[slot])
        if self.replicated:
            return write_record(*whole_unit(self.share, data), self._ids(request_id), kv,
                                list(blocks))  # fmt: skip
        return write_record(self.share, data, self._ids(request_id), kv, list(blocks))

    def load(
        self, slot: int, request_id: str, blocks: Sequence[int], kv: torch.Tensor
    ) -> str | None:
        """Read this rank's share of the request's states from ``blocks`` into ``slot``; None
        when done, else why the record is refused (not a state record, of another request,
        shape or split, or corrupt; the slot then holds garbage)."""
        self._check_blocks(blocks, kv)
        data = read_record(self.share, self._ids(request_id), kv, list(blocks))
        if isinstance(data, str):
            return data
        unpack(self.spec, data, self.conv[slot], self.recurrent[slot])
        return None

    def _ids(self, request_id: str) -> tuple[int, int]:
        return zlib.crc32(request_id.encode()), self.shape_crc

    def _check_blocks(self, blocks: Sequence[int], kv: torch.Tensor) -> None:
        n = self.record_blocks(cell_bytes(kv))
        if len(blocks) != n:
            raise ValueError(f"a state record takes {n} blocks, got {len(blocks)}")


def whole_unit(share: StateShare, data: torch.Tensor) -> tuple[StateShare, torch.Tensor]:
    """A replicated KV head's whole unit (its key heads' bytes of the stream) from every
    rank's share, gathered over the group (each rank's key heads follow the previous
    rank's); every rank calls it for the same request at once (``RankGroup.call_runners``)."""
    parts = [torch.empty_like(data) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, data)
    stream = torch.cat(parts)
    if stream.numel() != share.total:
        raise RuntimeError(f"the ranks' shares make {stream.numel()} bytes, not {share.total}")
    h, n = share.unit_start, share.num_units
    lo, hi = h * share.total // n, (h + 1) * share.total // n
    return dataclasses.replace(share, start=lo, length=hi - lo), stream[lo:hi]


def local_spec(spec: LinearAttnSpec, k_heads: int) -> LinearAttnSpec:
    """``spec`` with ``k_heads`` key heads (and their value heads): a rank's share."""
    ratio = spec.num_v_heads // spec.num_k_heads
    return dataclasses.replace(spec, num_k_heads=k_heads, num_v_heads=k_heads * ratio)


def cell_bytes(kv_cache: torch.Tensor) -> int:
    """One KV head's bytes of a block of ``kv_cache`` [blocks, layers, planes, size, heads,
    row]."""
    return kv_cache[0].numel() * kv_cache.element_size() // kv_cache.shape[4]


def slot_bytes(spec: LinearAttnSpec, dtype: torch.dtype) -> int:
    """One request's states: the conv states in ``dtype``, the recurrent ones in fp32."""
    conv, rec = spec.conv_state_shape, spec.recurrent_shape
    return len(spec.layers) * (conv[0] * conv[1] * dtype.itemsize + rec[0] * rec[1] * rec[2] * 4)


def pack(spec: LinearAttnSpec, conv: torch.Tensor, recurrent: torch.Tensor) -> torch.Tensor:
    """A slot's states (conv [layers, conv_dim, k - 1], recurrent [layers, v_heads, k_dim,
    v_dim]) as uint8 bytes in the stream's order: key head by key head, layer by layer."""
    parts = [_by_group(t, spec.num_k_heads) for t in _parts(spec, conv, recurrent)]
    return torch.cat([p.transpose(0, 1) for p in parts], dim=-1).reshape(-1)


def unpack(
    spec: LinearAttnSpec, data: torch.Tensor, conv: torch.Tensor, recurrent: torch.Tensor
) -> None:
    """``pack``'s inverse: ``data`` (uint8) into the slot's conv and recurrent states."""
    dsts = [_by_group(t, spec.num_k_heads) for t in _parts(spec, conv, recurrent)]
    layers, nk = conv.shape[0], spec.num_k_heads
    pieces = data.to(conv.device).view(nk, layers, -1).split([d.shape[-1] for d in dsts], -1)
    for dst, piece in zip(dsts, pieces, strict=True):
        dst.copy_(piece.transpose(0, 1))


def _parts(
    spec: LinearAttnSpec, conv: torch.Tensor, recurrent: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    q, k, v = conv.split((spec.key_dim, spec.key_dim, spec.value_dim), dim=1)
    return q, k, v, recurrent


def _by_group(t: torch.Tensor, groups: int) -> torch.Tensor:
    """t [layers, groups * n, ...] -> a uint8 view [layers, groups, bytes of n, ...]."""
    return t.view(torch.uint8).view(t.shape[0], groups, -1)
