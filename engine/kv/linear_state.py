"""The state cache of a hybrid model's linear-attention layers, beside the paged KV cache.

A Gated DeltaNet layer (``engine.model.gated_delta``) keeps no KV blocks: each request
carries a conv state and a recurrent state per such layer. They live in a fixed pool of
slots allocated at start (as many as requests may run at once, ``max_num_seqs``; their
bytes come off the KV cache's budget, ``engine.kv.sizing.SharedCache``). A request takes a
slot at its first step and gives it back when it leaves the running batch (finished,
aborted, preempted: a preempted request is recomputed from its first token, its state
rebuilt from zeros). A chunk at position 0 starts from zeros, later chunks and decodes from
what the request's previous step left.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import torch

from engine.kv.sizing import SharedCache
from engine.model.attention import LinearStates
from engine.model.specs import LinearAttnSpec

# a state record in KV blocks: magic, payload bytes, crc32 of the payload, of the request id,
# of the state's shape; then the conv states and the recurrent states of every layer
RECORD = struct.Struct("<8sQIII")
MAGIC = b"SSGDN001"
HEADER_BYTES = 64


class StatePool:
    """``slots`` per-request states of every linear-attention layer, on one device."""

    def __init__(
        self, spec: LinearAttnSpec, slots: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        if slots < 1:
            raise ValueError(f"StatePool needs at least one slot, got {slots}")
        layers = len(spec.layers)
        # conv: [slots, layers, conv_dim, kernel - 1] in the model dtype;
        # recurrent: [slots, layers, v_heads, k_dim, v_dim] fp32
        self.conv = torch.zeros(slots, layers, *spec.conv_state_shape, dtype=dtype, device=device)
        self.recurrent = torch.zeros(slots, layers, *spec.recurrent_shape, device=device)
        self.num_slots = slots
        self.shape_crc = zlib.crc32(f"{spec.describe()}|{dtype}".encode())
        self.slot_bytes = slot_bytes(spec, dtype)
        self._slots: dict[str, int] = {}
        self._free = list(range(slots - 1, -1, -1))

    @staticmethod
    def cache(spec: LinearAttnSpec, slots: int, dtype: torch.dtype) -> SharedCache:
        """The pool as a fixed share of the KV budget (engine.kv.sizing)."""
        return SharedCache("linear_state", 0, fixed_bytes=slots * slot_bytes(spec, dtype))

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

    def record_blocks(self, block_bytes: int) -> int:
        """KV blocks a request's state record takes (``save`` / ``load``)."""
        return -(-(HEADER_BYTES + self.slot_bytes) // block_bytes)

    def save(self, request_id: str, blocks: Sequence[int], kv_cache: torch.Tensor) -> None:
        """Write the request's states into ``blocks`` of the KV cache (the prefill role
        ships them with the prompt's blocks); the slot stays the request's."""
        self._check_blocks(blocks, kv_cache)
        slot = self._slots[request_id]
        payload = torch.cat((_bytes(self.conv[slot]), _bytes(self.recurrent[slot])))
        crc = _crc(payload)
        head = RECORD.pack(MAGIC, payload.numel(), crc, _id_crc(request_id), self.shape_crc)
        header = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
        header[: len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
        record = torch.cat((header.to(payload.device), payload))
        offset = 0
        for block in blocks:
            dst = _bytes(kv_cache[block])
            part = record[offset : offset + dst.numel()]
            dst[: part.numel()].copy_(part)
            offset += part.numel()

    def _check_blocks(self, blocks: Sequence[int], kv_cache: torch.Tensor) -> None:
        n = self.record_blocks(_bytes(kv_cache[0]).numel())
        if len(blocks) != n:
            raise ValueError(f"a state record takes {n} blocks, got {len(blocks)}")

    def load(self, request_id: str, blocks: Sequence[int], kv_cache: torch.Tensor) -> str | None:
        """Read the request's states from ``blocks`` into its slot (taken now); None when
        done, else why the record is refused (the slot given back): not a state record, of
        another request or shape, or corrupt."""
        self._check_blocks(blocks, kv_cache)
        record = torch.cat([_bytes(kv_cache[b]) for b in blocks])
        magic, size, crc, id_crc, shape_crc = RECORD.unpack(
            bytes(record[: RECORD.size].cpu().numpy())
        )
        conv_bytes, expected = _bytes(self.conv[0]).numel(), self.slot_bytes
        why = _refusal(
            (magic != MAGIC, "no state record"),
            (shape_crc != self.shape_crc or size != expected, "a state of another shape"),
            (id_crc != _id_crc(request_id), "another request's state"),
        )
        payload = record[HEADER_BYTES : HEADER_BYTES + expected]
        if why is None and _crc(payload) != crc:
            why = "a corrupt state (checksum)"
        if why is not None:
            return why
        slot = self.slot(request_id)
        _bytes(self.conv[slot]).copy_(payload[:conv_bytes])
        _bytes(self.recurrent[slot]).copy_(payload[conv_bytes:])
        return None


def slot_bytes(spec: LinearAttnSpec, dtype: torch.dtype) -> int:
    """One request's states: the conv states in ``dtype``, the recurrent ones in fp32."""
    conv, rec = spec.conv_state_shape, spec.recurrent_shape
    return len(spec.layers) * (conv[0] * conv[1] * dtype.itemsize + rec[0] * rec[1] * rec[2] * 4)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, as a flat uint8 view."""
    return t.reshape(-1).view(torch.uint8)


def _crc(data: torch.Tensor) -> int:
    """crc32 of uint8 ``data`` (read on the host)."""
    return zlib.crc32(data.cpu().numpy().tobytes())


def _id_crc(request_id: str) -> int:
    return zlib.crc32(request_id.encode())


def _refusal(*checks: tuple[bool, str]) -> str | None:
    return next((why for bad, why in checks if bad), None)
