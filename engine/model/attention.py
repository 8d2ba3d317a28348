"""Attention over the paged KV cache: per-step metadata, each layer's spec, the backends.

A step's tokens are flattened; its sequences are either decodes (one query token) or prefill
chunks (several query tokens, causal with an offset when a prefix is cached). Backends: the
torch one (``engine.model.torch_attention``: SDPA, and the C decode kernel on the CPU; the
oracle) and the Triton kernels (the GPU).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple, Protocol

import torch


class StateTensors(NamedTuple):
    """Slots of every linear-attention layer's states (a pool's, or its checkpoints')."""

    conv: torch.Tensor  # [slots, linear_layers, conv_dim, kernel - 1]
    recurrent: torch.Tensor  # [slots, linear_layers, v_heads, k_dim, v_dim] fp32


@dataclass(frozen=True)
class LinearStates:
    """The state pool of the linear-attention layers (``engine.kv.linear_state``) as a step
    reads it: each sequence's slot, in step order, and whether it starts from zeros (its
    chunk begins at position 0).

    With state checkpoints (``engine.kv.state_checkpoints``): ``loads[i]``, the checkpoint
    sequence ``i``'s chunk starts from (a prefix-cache hit; None: zeros or as it was), and
    ``saves[i]``, (offset in its chunk, checkpoint) pairs in order: the state after that
    many of the chunk's tokens is copied into the checkpoint. Empty tuples: none at all."""

    conv: torch.Tensor  # [slots, linear_layers, conv_dim, kernel - 1]
    recurrent: torch.Tensor  # [slots, linear_layers, v_heads, k_dim, v_dim] fp32
    slots: tuple[int, ...]
    fresh: tuple[bool, ...]
    checkpoints: StateTensors | None = None
    loads: tuple[int | None, ...] = ()
    saves: tuple[tuple[tuple[int, int], ...], ...] = ()

    def load(self, seq: int) -> int | None:
        return self.loads[seq] if self.loads else None

    def saves_of(self, seq: int) -> tuple[tuple[int, int], ...]:
        return self.saves[seq] if self.saves else ()

    def on(self, pool: StateTensors, checkpoints: StateTensors | None) -> LinearStates:
        """The same step over another rank's tensors (the slot numbers are rank 0's)."""
        return dataclasses.replace(
            self, conv=pool.conv, recurrent=pool.recurrent, checkpoints=checkpoints
        )


@dataclass(frozen=True)
class AttentionMetadata:
    """Where each sequence's query tokens sit in the flattened step and what they attend to.

    Sequence ``i`` owns tokens ``query_start_loc[i] .. query_start_loc[i + 1] - 1``; its
    queries sit at positions ``context_lens[i] - query_lens[i] .. context_lens[i] - 1`` and
    attend to every earlier position of the same sequence. The first ``num_decodes`` sequences
    have exactly one query token.
    """

    num_decodes: int
    query_lens: tuple[int, ...]  # host copies: no device sync to plan the step
    context_lens_host: tuple[int, ...]
    block_size: int
    positions: torch.Tensor  # [tokens] int64
    slot_mapping: torch.Tensor  # [tokens] int64: block id * block_size + offset
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    context_lens: torch.Tensor  # [num_seqs] int32
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with block 0
    # the linear-attention layers' states (None: no such layer, or a throwaway forward)
    states: LinearStates | None = field(default=None, compare=False)

    @classmethod
    def build(
        cls,
        query_lens: Sequence[int],
        starts: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> AttentionMetadata:
        """Tensors for sequences given as (query length, first position, block table).

        Block tables may be longer than needed; only the blocks that cover the context are
        kept. A table too short for its context raises ValueError naming the sequence.
        """
        context_lens = [s + n for s, n in zip(starts, query_lens, strict=True)]
        table_t = _padded_tables(block_tables, context_lens, block_size)  # [seqs, max_blocks]
        lens = torch.tensor(query_lens, dtype=torch.int64)  # [seqs]
        seq_starts = torch.tensor(starts, dtype=torch.int64)  # [seqs]
        qsl = torch.zeros(len(lens) + 1, dtype=torch.int64)
        torch.cumsum(lens, 0, out=qsl[1:])
        seq_of_token = torch.repeat_interleave(torch.arange(len(lens)), lens)  # [tokens]
        offsets = torch.arange(int(qsl[-1])) - qsl[seq_of_token]  # [tokens]
        positions = seq_starts[seq_of_token] + offsets  # [tokens]
        blocks = table_t[seq_of_token, positions // block_size].long()  # [tokens]
        slots = blocks * block_size + positions % block_size
        num_decodes = next((i for i, n in enumerate(query_lens) if n != 1), len(query_lens))
        return cls(
            num_decodes=num_decodes,
            query_lens=tuple(query_lens),
            context_lens_host=tuple(context_lens),
            block_size=block_size,
            positions=positions.to(device),
            slot_mapping=slots.to(device),
            query_start_loc=qsl.to(device, torch.int32),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
            block_tables=table_t.to(device),
        )

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    @cached_property
    def decode_block_tables(self) -> torch.Tensor:
        """[decodes, blocks] int32: the decodes' tables, only as wide as they need."""
        d = self.num_decodes
        width = max((-(-n // self.block_size) for n in self.context_lens_host[:d]), default=0)
        return self.block_tables[:d, :width]

    @cached_property
    def prefill_query_start_loc(self) -> torch.Tensor:
        """[prefills + 1] int32: query offsets of the prefill chunks, from 0."""
        qsl = self.query_start_loc[self.num_decodes :]
        return qsl - qsl[0]


@dataclass(frozen=True)
class AttentionSpec:
    """How one layer attends: score scale, sliding window (0: full causal; else a query at
    position p sees keys in (p - window, p]), soft-cap of the scores (0: off) and attention
    sinks (gpt-oss: a learned logit per query head [heads] in each softmax's denominator,
    attending to nothing; None: off)."""

    scale: float
    window: int = 0
    softcap: float = 0.0
    sinks: torch.Tensor | None = field(default=None, compare=False)


class AttentionBackend(Protocol):
    """Attention of a step's queries over the paged cache, after its new K/V are written."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        layer: int,
        meta: AttentionMetadata,
        spec: AttentionSpec | None = None,
    ) -> torch.Tensor:
        """q: [tokens, heads, d]; k, v: [tokens, kv_heads, d] (this step's, already in the
        cache). Returns [tokens, heads, d]."""
        ...


class TritonAttention:
    """The Triton kernels (engine.triton_kernels) behind the same interface: the GPU backend
    (windows, soft-caps and attention sinks in the kernels)."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        layer: int,
        meta: AttentionMetadata,
        spec: AttentionSpec | None = None,
    ) -> torch.Tensor:
        from engine.triton_kernels import paged_decode_attention, paged_prefill_attention

        spec = spec or AttentionSpec(q.shape[-1] ** -0.5)
        d, scale, window, cap = meta.num_decodes, spec.scale, spec.window, spec.softcap
        sinks = spec.sinks
        if d == meta.num_tokens:
            return paged_decode_attention(
                q, kv_cache, layer, meta.decode_block_tables, meta.context_lens, scale,
                max_ctx_len=max(meta.context_lens_host), window=window, softcap=cap, sinks=sinks,
            )  # fmt: skip
        out = torch.empty_like(q)  # [tokens, heads, d]
        if d:
            out[:d] = paged_decode_attention(
                q[:d], kv_cache, layer, meta.decode_block_tables, meta.context_lens[:d], scale,
                max_ctx_len=max(meta.context_lens_host[:d]), window=window, softcap=cap,
                sinks=sinks,
            )  # fmt: skip
        out[d:] = paged_prefill_attention(
            q[d:], kv_cache, layer, meta.prefill_query_start_loc, meta.context_lens[d:],
            meta.block_tables[d:], scale, max_q_len=max(meta.query_lens[d:]), window=window,
            softcap=cap, sinks=sinks,
        )  # fmt: skip
        return out


def _padded_tables(
    block_tables: Sequence[Sequence[int]], context_lens: Sequence[int], block_size: int
) -> torch.Tensor:
    """[seqs, width] int32: each table cut to the blocks its context needs, padded with 0."""
    needed = [-(-n // block_size) for n in context_lens]
    width = max(needed, default=0)
    flat: list[int] = []
    for i, (table, n) in enumerate(zip(block_tables, needed, strict=True)):
        if len(table) < n:
            raise ValueError(f"sequence {i}: block table has {len(table)} blocks, needs {n}")
        flat += table[:n]
        flat += [0] * (width - n)
    return torch.tensor(flat, dtype=torch.int32).view(len(needed), width)
