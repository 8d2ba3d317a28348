"""Attention over the paged KV cache: per-step metadata and the torch backend.

The torch backend runs on the CPU and is the oracle for the Triton kernels. A step's tokens
are flattened; its sequences are either decodes (one query token, batched into one SDPA call)
or prefill chunks (several query tokens, causal with an offset when a prefix is cached).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import torch
import torch.nn.functional as F

from engine import cpu_kernels


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
    def decode_mask(self) -> torch.Tensor:
        """[decodes, 1, 1, keys] bool: key slots inside each decode's context."""
        d = self.num_decodes
        num_keys = self.decode_block_tables.shape[1] * self.block_size
        keys = torch.arange(num_keys, device=self.block_tables.device)
        return (keys[None, :] < self.context_lens[:d, None])[:, None, None, :]

    @cached_property
    def prefill_query_start_loc(self) -> torch.Tensor:
        """[prefills + 1] int32: query offsets of the prefill chunks, from 0."""
        qsl = self.query_start_loc[self.num_decodes :]
        return qsl - qsl[0]

    @cached_property
    def prefill_masks(self) -> dict[int, torch.Tensor]:
        """Sequence index -> [queries, context] bool causal mask, for chunks after a prefix."""
        device = self.block_tables.device
        masks = {}
        for i in range(self.num_decodes, len(self.query_lens)):
            n, ctx = self.query_lens[i], self.context_lens_host[i]
            if ctx > n:
                query_pos = torch.arange(ctx - n, ctx, device=device)
                masks[i] = torch.arange(ctx, device=device)[None, :] <= query_pos[:, None]
        return masks


@dataclass(frozen=True)
class AttentionSpec:
    """How one layer attends: score scale, sliding window (0: full causal; else a query at
    position p sees keys in (p - window, p]) and soft-cap of the scores (0: off)."""

    scale: float
    window: int = 0
    softcap: float = 0.0


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


class GatherBuffers:
    """K and V gather buffers reused across layers and steps.

    A fresh multi-megabyte tensor per layer costs page faults on the CPU that were measured
    to take longer than the gather itself; these grow to the largest step seen and stay.
    """

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None

    def take(self, blocks: int, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Two [blocks, block_size, kv_heads, d] buffers shaped like ``kv_cache``'s blocks."""
        shape = (blocks, *kv_cache.shape[3:])
        n = blocks * kv_cache[0, 0, 0].numel()
        buf = self._buf
        if (
            buf is None
            or buf.numel() < 2 * n
            or buf.dtype != kv_cache.dtype
            or (buf.device != kv_cache.device)
        ):
            buf = self._buf = torch.empty(2 * n, dtype=kv_cache.dtype, device=kv_cache.device)
        return buf[:n].view(shape), buf[n : 2 * n].view(shape)


class TorchAttention:
    """SDPA over gathered blocks: one batched call for all decodes, one call per prefill chunk.

    On the CPU the decodes go to the C kernel of ``engine.cpu_kernels`` when it is built and
    takes the shapes (fp32): it reads the blocks in place instead of gathering and padding
    them, and was measured at 4-5x the gather + SDPA path. ``cpu_kernel=False`` keeps torch.
    """

    def __init__(self, cpu_kernel: bool = True) -> None:
        self.buffers = GatherBuffers()
        self.cpu_kernel = cpu_kernel

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
        d = meta.num_decodes
        if d == meta.num_tokens:
            return self._decodes(q, kv_cache, layer, meta)
        out = torch.empty_like(q)  # [tokens, heads, d]
        if d:
            out[:d] = self._decodes(q[:d], kv_cache, layer, meta)
        start = d
        for i in range(d, len(meta.query_lens)):
            end = start + meta.query_lens[i]
            mask = meta.prefill_masks.get(i)
            if mask is None:  # no cached prefix: this step's K/V are the whole context
                out[start:end] = _sdpa(q[start:end], k[start:end], v[start:end], None)
            else:
                table = meta.block_tables[i, : -(-mask.shape[1] // meta.block_size)]
                kc, vc = gather_blocks(kv_cache, layer, table, self.buffers)
                out[start:end] = _sdpa(q[start:end], kc[: mask.shape[1]], vc[: mask.shape[1]], mask)
            start = end
        return out

    def _decodes(
        self, q: torch.Tensor, kv_cache: torch.Tensor, layer: int, meta: AttentionMetadata
    ) -> torch.Tensor:
        tables = meta.decode_block_tables
        if self.cpu_kernel and cpu_kernels.supports(q, kv_cache):
            lens = meta.context_lens[: meta.num_decodes]
            scale = q.shape[-1] ** -0.5
            return cpu_kernels.paged_decode_attention(q, kv_cache, layer, tables, lens, scale)
        return decode_attention(q, kv_cache, layer, tables, meta.decode_mask, self.buffers)


class TritonAttention:
    """The Triton kernels (engine.triton_kernels) behind the same interface: the GPU backend."""

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

        d, scale = meta.num_decodes, q.shape[-1] ** -0.5
        if d == meta.num_tokens:
            return paged_decode_attention(
                q, kv_cache, layer, meta.decode_block_tables, meta.context_lens, scale,
                max_ctx_len=max(meta.context_lens_host),
            )  # fmt: skip
        out = torch.empty_like(q)  # [tokens, heads, d]
        if d:
            out[:d] = paged_decode_attention(
                q[:d], kv_cache, layer, meta.decode_block_tables, meta.context_lens[:d], scale,
                max_ctx_len=max(meta.context_lens_host[:d]),
            )  # fmt: skip
        out[d:] = paged_prefill_attention(
            q[d:], kv_cache, layer, meta.prefill_query_start_loc, meta.context_lens[d:],
            meta.block_tables[d:], scale, max_q_len=max(meta.query_lens[d:]),
        )  # fmt: skip
        return out


def select_attention(name: str, device: torch.device, cpu_kernel: bool = True) -> AttentionBackend:
    """``torch``, ``triton``, or ``auto``: Triton on CUDA when it is importable, else torch."""
    if name not in ("auto", "torch", "triton"):
        raise ValueError(f"attention backend must be auto, torch or triton, got {name!r}")
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TorchAttention(cpu_kernel)
    from engine.triton_kernels import triton_available

    if triton_available():
        return TritonAttention()
    if name == "triton":
        raise ValueError(
            "attention_backend 'triton' needs triton and a CUDA device (or TRITON_INTERPRET=1)"
        )
    return TorchAttention(cpu_kernel)


def decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    layer: int,
    block_tables: torch.Tensor,
    mask: torch.Tensor,
    buffers: GatherBuffers | None = None,
) -> torch.Tensor:
    """One query per sequence over its paged context, all sequences in one SDPA call.

    q: [seqs, heads, d]; block_tables: [seqs, max_blocks]; mask: [seqs, 1, 1, max_blocks *
    block_size] bool. Returns [seqs, heads, d].
    """
    seqs, _, head_dim = q.shape
    kv_heads = kv_cache.shape[4]
    k, v = gather_blocks(kv_cache, layer, block_tables.flatten(), buffers)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2),  # [seqs, heads, 1, d]
        k.view(seqs, -1, kv_heads, head_dim).transpose(1, 2),  # [seqs, kv_heads, keys, d]
        v.view(seqs, -1, kv_heads, head_dim).transpose(1, 2),
        attn_mask=mask,
        enable_gqa=True,
    )
    return out.squeeze(2)


def gather_blocks(
    kv_cache: torch.Tensor,
    layer: int,
    table: torch.Tensor,
    buffers: GatherBuffers | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of ``layer`` in the blocks of ``table`` [n], in order: each [n * block_size,
    kv_heads, d]. Views into ``buffers`` when given (valid until their next use)."""
    if buffers is None:
        k = kv_cache[:, layer, 0].index_select(0, table)
        v = kv_cache[:, layer, 1].index_select(0, table)
    else:
        k, v = buffers.take(table.shape[0], kv_cache)
        torch.index_select(kv_cache[:, layer, 0], 0, table, out=k)
        torch.index_select(kv_cache[:, layer, 1], 0, table, out=v)
    return k.flatten(0, 1), v.flatten(0, 1)


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Causal attention of one sequence. q: [n, heads, d]; k, v: [ctx, kv_heads, d];
    mask: [n, ctx] bool, or None for plain causal with n == ctx. Returns [n, heads, d]."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),  # [1, heads, n, d]
        k.transpose(0, 1).unsqueeze(0),  # [1, kv_heads, ctx, d]
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask,
        is_causal=mask is None,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


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
