"""Attention over MLA's latent cache: the C or Triton kernel where the step's backend has
one (``engine.model.mla_kernels``: the absorbed form for decodes and prefill chunks alike),
else torch, the kernels' oracle.

A latent cache row of a token is ``[c, k_pe]``: the normed latent c (``kv_lora_rank``) and the
rotated key shared by every head (``qk_rope_head_dim``). Per head h, the key is
``[W_uk[h] c, k_pe]`` and the value ``W_uv[h] c`` (``kv_b_proj``'s two halves).

- Decodes use the absorbed form: ``q_nope[h] . W_uk[h] c = (W_uk[h]^T q_nope[h]) . c``, so
  each query head becomes a ``latent_dim`` query against the rows as they are stored (one
  shared KV head, MQA), and the output ``W_uv[h] (sum_t p_t c_t)``: no key or value is ever
  expanded, a step reads ``latent_dim`` values a token.
- Prefill chunks expand their context's keys and values per head once (``kv_b_proj``) and
  attend as ordinary multi-head attention: fewer FLOPs than the absorbed form over a long
  chunk (``qk_head_dim`` < ``latent_dim``). The kernels keep the absorbed form there too
  (one code path, no expanded keys written anywhere).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.kv_format.rows import read_plane
from engine.model.attention import AttentionBackend, AttentionMetadata
from engine.model.mla_kernels import latent_kernel
from engine.model.torch_attention import attend, attend_batched, chunk_mask


class LatentQuery(NamedTuple):
    """A step's query halves: q_nope [tokens, heads, nope], q_pe [tokens, heads, rope] (rotated);
    rows [tokens, 1, latent_dim]: this step's latent rows (already in the cache)."""

    q_nope: torch.Tensor
    q_pe: torch.Tensor
    rows: torch.Tensor


class Absorbed(NamedTuple):
    """``kv_b_proj`` [heads * (nope + v), kv_lora] split per head: w_uk [heads, nope, kv_lora]
    and w_uv [heads, v, kv_lora] (views)."""

    w_uk: torch.Tensor
    w_uv: torch.Tensor

    @classmethod
    def split(cls, kv_b: torch.Tensor, heads: int, nope: int) -> Absorbed:
        per_head = kv_b.view(heads, -1, kv_b.shape[-1])  # [heads, nope + v, kv_lora]
        return cls(per_head[:, :nope], per_head[:, nope:])


def latent_attention(
    query: LatentQuery,
    weights: Absorbed,
    kv_cache: torch.Tensor,
    layer: int,
    meta: AttentionMetadata,
    scale: float,
    attention: AttentionBackend | None = None,
) -> torch.Tensor:
    """Attention of a step over the latent cache -> [tokens, heads, v_head_dim], by the
    kernel of ``attention`` where it has one (None: torch)."""
    kernel = latent_kernel(attention, query.q_pe, kv_cache)
    if kernel is not None:
        q = absorb(query.q_nope, query.q_pe, weights)
        o_lat = kernel(q, kv_cache, layer, meta, weights.w_uk.shape[2], scale)
        return torch.einsum("thc,hvc->thv", o_lat, weights.w_uv)
    d, n = meta.num_decodes, meta.num_tokens
    heads, v_dim = weights.w_uv.shape[:2]
    out = query.q_nope.new_empty(n, heads, v_dim)
    if d:
        out[:d] = _decodes(query, weights, kv_cache, layer, meta, scale)
    start = d
    for i in range(d, len(meta.query_lens)):
        end = start + meta.query_lens[i]
        out[start:end] = _chunk(query, weights, kv_cache, layer, meta, i, start, scale)
        start = end
    return out


def _decodes(
    query: LatentQuery,
    weights: Absorbed,
    kv_cache: torch.Tensor,
    layer: int,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """The absorbed form for the step's decodes, all in one SDPA call."""
    d, kv_lora = meta.num_decodes, weights.w_uk.shape[-1]
    q = absorb(query.q_nope[:d], query.q_pe[:d], weights)  # [d, heads, latent]
    tables = meta.decode_block_tables  # [d, width]
    rows = read_plane(kv_cache, layer, 0, tables.flatten()).to(q.dtype)
    rows = rows.view(d, 1, -1, rows.shape[-1])  # [d, 1, keys, latent]
    keys = torch.arange(rows.shape[2], device=q.device)
    mask = keys[None, :] < meta.context_lens[:d, None]  # [d, keys]
    o_lat = attend_batched(  # [d, heads, 1, kv_lora]
        q.unsqueeze(2), rows, rows[..., :kv_lora], mask[:, None, None, :], scale, 0.0
    )
    return torch.einsum("thc,hvc->thv", o_lat.squeeze(2), weights.w_uv)


def absorb(q_nope: torch.Tensor, q_pe: torch.Tensor, weights: Absorbed) -> torch.Tensor:
    """Queries in the latent space: [tokens, heads, latent], per head ``W_uk^T q_nope`` then
    the rotated ``q_pe``."""
    q_lat = torch.einsum("thn,hnc->thc", q_nope, weights.w_uk)  # [tokens, heads, kv_lora]
    return torch.cat((q_lat, q_pe), dim=-1)


def _chunk(
    query: LatentQuery,
    weights: Absorbed,
    kv_cache: torch.Tensor,
    layer: int,
    meta: AttentionMetadata,
    seq: int,
    start: int,
    scale: float,
) -> torch.Tensor:
    """Prefill chunk ``seq`` (tokens ``start ..``) over its expanded context."""
    n, ctx = meta.query_lens[seq], meta.context_lens_host[seq]
    end = start + n
    if ctx == n:  # no cached prefix: this step's rows are the context
        rows = query.rows[start:end, 0]
    else:
        table = meta.block_tables[seq, : -(-ctx // meta.block_size)]
        rows = read_plane(kv_cache, layer, 0, table).flatten(0, 2)[:ctx].to(query.q_nope.dtype)
    k, v = expand(rows, weights)
    q = torch.cat((query.q_nope[start:end], query.q_pe[start:end]), dim=-1)
    mask = None if ctx == n else chunk_mask(n, ctx, 0, q.device)
    return attend(q, k, v, mask, scale)


def expand(rows: torch.Tensor, weights: Absorbed) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [ctx, latent] -> keys [ctx, heads, nope + rope] and values [ctx, heads, v]."""
    heads, kv_lora = weights.w_uk.shape[0], weights.w_uk.shape[2]
    c, k_pe = rows[:, :kv_lora], rows[:, kv_lora:]
    k_nope = torch.einsum("tc,hnc->thn", c, weights.w_uk)
    v = torch.einsum("tc,hvc->thv", c, weights.w_uv)
    k = torch.cat((k_nope, k_pe[:, None].expand(-1, heads, -1)), dim=-1)
    return k, v
