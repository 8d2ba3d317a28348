"""The torch attention backend: SDPA over gathered blocks, the CPU's C decode kernel.

It runs on the CPU and is the oracle for the Triton kernels. A step's sequences are either
decodes (one query token, batched into one SDPA call, or the C kernel) or prefill chunks
(several query tokens, causal with an offset when a prefix is cached). Every path takes the
layer's ``AttentionSpec``: its score scale, sliding window (a query at position p sees the
keys in (p - window, p]), soft-cap and attention sinks; soft-capped scores and a sink's
softmax are computed explicitly (SDPA has neither), the rest stays in SDPA; the C kernels
take all of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine import cpu_kernels
from engine.cpu_kernels.prefill_amx import prefill_attention_bf16
from engine.kv_format.rows import dequantize_rows, is_quantized
from engine.model.attention import AttentionMetadata, AttentionSpec


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
    them, and was measured at 4-5x the gather + SDPA path. The prefill chunks go to the C
    prefill kernel (``engine.cpu_kernels.prefill``, flash-attention style, K/V read once per
    group of query heads), all in one call. ``cpu_kernel=False`` keeps torch. With
    ``bf16_prefill`` (float32_matmul_precision "medium") a step whose prompts all start
    without a cached prefix, with no window or soft-cap, runs them on AMX tiles in bf16
    products instead (``engine.cpu_kernels.prefill_amx``) where the build has the tiles.
    """

    def __init__(self, cpu_kernel: bool = True) -> None:
        self.buffers = GatherBuffers()
        self.cpu_kernel = cpu_kernel
        self.bf16_prefill = False
        # the C prefill kernels' index of the last step, checked once and read by every layer,
        # and whether all its prefill chunks are whole prompts (the step's metadata is kept
        # alive with it, so ``is`` cannot match a newer step)
        self._index: tuple[AttentionMetadata, int, cpu_kernels.PrefillIndex, bool] | None = None

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
        scale = spec.scale if spec is not None else q.shape[-1] ** -0.5
        window = spec.window if spec is not None else 0
        cap = spec.softcap if spec is not None else 0.0
        sinks = spec.sinks if spec is not None else None
        d = meta.num_decodes
        if d == meta.num_tokens:
            return self._decodes(q, kv_cache, layer, meta, scale, window, cap, sinks)
        if self.cpu_kernel and cpu_kernels.prefill_supported(q, k, v, kv_cache):
            return self._with_prefill_kernel(
                q, k, v, kv_cache, layer, meta, scale, window, cap, sinks
            )
        out = torch.empty_like(q)  # [tokens, heads, d]
        if d:
            out[:d] = self._decodes(q[:d], kv_cache, layer, meta, scale, window, cap, sinks)
        start = d
        for i in range(d, len(meta.query_lens)):
            n, ctx = meta.query_lens[i], meta.context_lens_host[i]
            end = start + n
            if ctx == n and not window:  # no cached prefix: this step's K/V are the context
                qs, ks, vs = q[start:end], k[start:end], v[start:end]
                out[start:end] = attend(qs, ks, vs, None, scale, cap, sinks)
            else:
                mask = chunk_mask(n, ctx, window, q.device)  # [n, ctx]
                if ctx == n:
                    kc, vc = k[start:end], v[start:end]
                else:
                    table = meta.block_tables[i, : -(-ctx // meta.block_size)]
                    kc, vc = gather_blocks(kv_cache, layer, table, self.buffers)
                out[start:end] = attend(q[start:end], kc[:ctx], vc[:ctx], mask, scale, cap, sinks)
            start = end
        return out

    def _with_prefill_kernel(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        layer: int,
        meta: AttentionMetadata,
        scale: float,
        window: int,
        cap: float,
        sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        """All prefill chunks in one call of the C prefill kernel, the decodes in the decode
        kernel: the same answers as SDPA per chunk (a fresh prompt over its fresh K/V)."""
        d = meta.num_decodes
        index, fresh = self._step_index(q, kv_cache, meta)
        prefill = None
        if fresh and self.bf16_prefill and not (window or cap or sinks is not None):
            prefill = prefill_attention_bf16(q[d:], k[d:], v[d:], index.query_start_loc, scale)
        if prefill is None:
            prefill = cpu_kernels.paged_prefill_attention(
                q[d:], k[d:], v[d:], kv_cache, layer, index.query_start_loc, index.context_lens,
                index.block_tables, scale, window, cap, index=index, sinks=sinks,
            )  # fmt: skip
        if not d:
            return prefill
        out = torch.empty_like(q)  # [tokens, heads, d]
        out[:d] = self._decodes(q[:d], kv_cache, layer, meta, scale, window, cap, sinks)
        out[d:] = prefill
        return out

    def _step_index(
        self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[cpu_kernels.PrefillIndex, bool]:
        """The step's prefill index (``cpu_kernels.prefill_index``) and whether every prefill
        chunk is a whole prompt (no cached prefix), worked out on the step's first layer."""
        d, block_size = meta.num_decodes, kv_cache.shape[3]
        cached = self._index
        if cached is None or cached[0] is not meta or cached[1] != block_size:
            index = cpu_kernels.prefill_index(
                meta.prefill_query_start_loc, meta.context_lens[d:], meta.block_tables[d:],
                q.shape[0] - d, block_size,
            )  # fmt: skip
            lens = meta.context_lens_host
            fresh = all(lens[i] == meta.query_lens[i] for i in range(d, len(meta.query_lens)))
            cached = self._index = (meta, block_size, index, fresh)
        return cached[2], cached[3]

    def _decodes(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        layer: int,
        meta: AttentionMetadata,
        scale: float,
        window: int,
        cap: float,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        tables = meta.decode_block_tables
        lens = meta.context_lens[: meta.num_decodes]
        if self.cpu_kernel and cpu_kernels.supports(q, kv_cache):
            return cpu_kernels.paged_decode_attention(
                q, kv_cache, layer, tables, lens, scale, window, cap, sinks
            )
        keys = torch.arange(tables.shape[1] * meta.block_size, device=q.device)
        mask = keys[None, :] < lens[:, None]  # [decodes, keys]
        if window:
            mask &= keys[None, :] >= lens[:, None] - window
        return decode_attention(
            q, kv_cache, layer, tables, mask[:, None, None, :], self.buffers, scale, cap, sinks
        )


def chunk_mask(n: int, ctx: int, window: int, device: torch.device) -> torch.Tensor:
    """[n, ctx] bool: the keys each of a chunk's n queries (the last n of ctx) sees."""
    query_pos = torch.arange(ctx - n, ctx, device=device)[:, None]
    keys = torch.arange(ctx, device=device)[None, :]
    mask = keys <= query_pos
    return mask & (keys > query_pos - window) if window else mask


def decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    layer: int,
    block_tables: torch.Tensor,
    mask: torch.Tensor,
    buffers: GatherBuffers | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per sequence over its paged context, all sequences in one SDPA call.

    q: [seqs, heads, d]; block_tables: [seqs, max_blocks]; mask: [seqs, 1, 1, max_blocks *
    block_size] bool. Returns [seqs, heads, d].
    """
    seqs, _, head_dim = q.shape
    kv_heads = kv_cache.shape[4]
    k, v = gather_blocks(kv_cache, layer, block_tables.flatten(), buffers)
    out = attend_batched(
        q.unsqueeze(2),  # [seqs, heads, 1, d]
        k.view(seqs, -1, kv_heads, head_dim).transpose(1, 2),  # [seqs, kv_heads, keys, d]
        v.view(seqs, -1, kv_heads, head_dim).transpose(1, 2),
        mask,
        scale if scale is not None else head_dim**-0.5,
        softcap,
        sinks,
    )
    return out.squeeze(2)


def gather_blocks(
    kv_cache: torch.Tensor,
    layer: int,
    table: torch.Tensor,
    buffers: GatherBuffers | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of ``layer`` in the blocks of ``table`` [n], in order: each [n * block_size,
    kv_heads, d]. Views into ``buffers`` when given (valid until their next use). A quantized
    cache's rows come back dequantised to fp32."""
    if buffers is None or is_quantized(kv_cache):
        k = kv_cache[:, layer, 0].index_select(0, table)
        v = kv_cache[:, layer, 1].index_select(0, table)
        if is_quantized(kv_cache):  # [n, block_size, kv_heads, d + 8] codes, scales, mids
            k, v = dequantize_rows(k, torch.float32), dequantize_rows(v, torch.float32)
    else:
        k, v = buffers.take(table.shape[0], kv_cache)
        torch.index_select(kv_cache[:, layer, 0], 0, table, out=k)
        torch.index_select(kv_cache[:, layer, 1], 0, table, out=v)
    return k.flatten(0, 1), v.flatten(0, 1)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one sequence. q: [n, heads, d]; k, v: [ctx, kv_heads, d]; mask: [n, ctx]
    bool, or None for plain causal with n == ctx. Returns [n, heads, d]."""
    out = attend_batched(
        q.transpose(0, 1).unsqueeze(0),  # [1, heads, n, d]
        k.transpose(0, 1).unsqueeze(0),  # [1, kv_heads, ctx, d]
        v.transpose(0, 1).unsqueeze(0),
        mask,
        scale,
        softcap,
        sinks,
    )
    return out[0].transpose(0, 1)


def attend_batched(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [b, heads, n, d]; k, v: [b, kv_heads, ctx, d]; mask broadcast to [b, heads, n, ctx]
    (None: causal, n == ctx). SDPA, or explicit scores with ``softcap`` or ``sinks`` [heads]
    (one more logit per head in the softmax, its weight dropped)."""
    k, v = k.to(q.dtype), v.to(q.dtype)  # dequantised fp32 rows of a quantized cache
    if not softcap and sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
        )
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).float()
    v = v.repeat_interleave(group, dim=1).float()
    scores = q.float() @ k.transpose(-1, -2) * scale  # [b, heads, n, ctx]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        n = q.shape[2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        return (torch.softmax(scores, dim=-1) @ v).to(q.dtype)
    sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    return (probs @ v).to(q.dtype)
