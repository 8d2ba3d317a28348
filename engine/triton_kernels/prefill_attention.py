"""Paged prefill attention, FlashAttention-2 style: new tokens over cached prefix + themselves.

Flattened batch: the queries of sequence ``b`` are rows ``cu_q[b]:cu_q[b+1]`` of ``q``; their
absolute positions end at ``ctx_lens[b] - 1``. The new tokens' K/V must already be written to
the cache (``write_kv``), so prefix and new keys are read the same way, through the block
table.

The grid is (query tile, sequence, KV head). A tile's rows are (query token, head of the GQA
group) pairs, so each K/V tile is read once for the whole group and both products go through
``tl.dot``. The online softmax runs in fp32 in the log2 domain. Each program walks only the
keys its queries can see, in three runs of key tiles: those cut by the sliding window's lower
edge (masked), those every query of the tile sees (no mask), and those on the causal
diagonal (masked). Tiles past the last query or below the window are never visited.
A quantized cache (int8 / fp8 e4m3 rows) is dequantized in registers as each tile is read.
Attention sinks (gpt-oss: one learned logit per query head) add one more term to each row's
softmax denominator as the output is written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.triton_kernels.kv_quant import cache_views, load_kv_tile
from engine.triton_kernels.layout import (
    check_attention_inputs,
    dot_precision,
    interpreted,
    kv_layer_view,
    pow2,
    sink_logits,
    sink_share,
    soft_cap,
)

_LOG2E = 1.4426950408889634


@triton.jit
def _key_tile(
    acc,  # [BLOCK_M, HEAD_PAD] fp32
    m_i,  # [BLOCK_M] running max, log2 domain
    l_i,  # [BLOCK_M] running sum
    q,  # [BLOCK_M, HEAD_PAD]
    q_pos,  # [BLOCK_M] absolute query positions
    start,  # first key position of the tile
    kv_end,  # keys at or past this are outside every query's view
    window,  # 0: full causal
    kv_ptr,
    param_ptr,
    bt_row,
    head_base,
    v_offset,
    stride_kb,
    stride_kt,
    qk_scale,
    cap,  # soft-cap * log2(e), used when SOFTCAP
    d,
    d_mask,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,  # False: every query of the tile sees every key of this tile
    PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    QUANT: tl.constexpr,
):
    tok = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
    t_mask = tok < kv_end
    block = tl.load(bt_row + tok // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
    row = head_base + block * stride_kb + (tok % BLOCK_SIZE) * stride_kt  # [BLOCK_N]
    k = load_kv_tile(kv_ptr, param_ptr, row, d, t_mask, d_mask, HEAD_DIM, QUANT).to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
    if SOFTCAP:
        s = soft_cap(s, cap)
    if MASKED:
        seen = t_mask[None, :] & (tok[None, :] <= q_pos[:, None])
        seen = seen & ((window == 0) | (tok[None, :] > q_pos[:, None] - window))
        s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    v = load_kv_tile(kv_ptr, param_ptr, row + v_offset, d, t_mask, d_mask, HEAD_DIM, QUANT)
    v = v.to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _prefill_kernel(
    q_ptr,  # [tokens, heads, d]
    kv_ptr,  # the whole cache (its bytes when QUANT)
    param_ptr,  # the cache as bf16 (scales and mids) when QUANT
    cu_q_ptr,  # [batch + 1] int32
    ctx_ptr,  # [batch]
    bt_ptr,  # [batch, max_blocks] int32
    out_ptr,  # [tokens, heads, d]
    sink_ptr,  # [heads] fp32 sink logits * log2(e), read when SINKS
    qk_scale,  # softmax scale * log2(e)
    window,  # 0: full causal; else a query at p sees keys in (p - window, p]
    cap,  # soft-cap of the scores * log2(e), used when SOFTCAP
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_btb,
    layer_offset,
    v_offset,
    stride_kb,
    stride_kt,
    stride_kh,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
    QUANT: tl.constexpr,  # 0: model dtype; 1: int8 rows; 2: fp8 e4m3 rows
    SINKS: tl.constexpr,
):
    tile_m = tl.num_programs(0) - 1 - tl.program_id(0)  # the longest tiles start first
    seq = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    prefix = tl.load(ctx_ptr + seq).to(tl.int32) - q_len
    rows = q_len * GROUP  # (token, group head) pairs of this sequence and KV head

    r = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    r_mask = r < rows
    q_pos = prefix + r // GROUP  # [BLOCK_M]
    head = kv_head * GROUP + r % GROUP  # [BLOCK_M]
    d = tl.arange(0, HEAD_PAD)
    d_mask = d < HEAD_DIM
    q_mask = r_mask[:, None] & d_mask[None, :]
    q_rows = (q_start + r // GROUP).to(tl.int64) * stride_qt + head * stride_qh  # [BLOCK_M]
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=q_mask, other=0.0)

    # Key runs of this tile: [kv_lo, lead_end) window edge, [lead_end, mid_end) unmasked,
    # [mid_end, kv_end) causal diagonal. An empty tile gets empty runs.
    live = tile_m * BLOCK_M < rows
    lo_pos = prefix + (tile_m * BLOCK_M) // GROUP
    hi_pos = prefix + (tl.minimum((tile_m + 1) * BLOCK_M, rows) - 1) // GROUP
    kv_end = tl.where(live, hi_pos + 1, 0)
    kv_lo = tl.where(live & (window > 0), tl.maximum(lo_pos - window + 1, 0), 0)
    full_lo = tl.where(live & (window > 0), tl.maximum(hi_pos - window + 1, 0), 0)
    full_hi = tl.where(live, lo_pos + 1, 0)
    lead_end = kv_lo + tl.cdiv(full_lo - kv_lo, BLOCK_N) * BLOCK_N
    mid_end = lead_end + (tl.maximum(full_hi - lead_end, 0) // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_btb
    head_base = layer_offset + kv_head * stride_kh
    for start in range(kv_lo, lead_end, BLOCK_N):
        acc, m_i, l_i = _key_tile(
            acc, m_i, l_i, q, q_pos, start, kv_end, window, kv_ptr, param_ptr, bt_row, head_base,
            v_offset, stride_kb, stride_kt, qk_scale, cap, d, d_mask,
            BLOCK_SIZE, BLOCK_N, True, PRECISION, SOFTCAP, HEAD_DIM, QUANT,
        )  # fmt: skip
    for start in range(lead_end, mid_end, BLOCK_N):
        acc, m_i, l_i = _key_tile(
            acc, m_i, l_i, q, q_pos, start, kv_end, window, kv_ptr, param_ptr, bt_row, head_base,
            v_offset, stride_kb, stride_kt, qk_scale, cap, d, d_mask,
            BLOCK_SIZE, BLOCK_N, False, PRECISION, SOFTCAP, HEAD_DIM, QUANT,
        )  # fmt: skip
    for start in range(mid_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _key_tile(
            acc, m_i, l_i, q, q_pos, start, kv_end, window, kv_ptr, param_ptr, bt_row, head_base,
            v_offset, stride_kb, stride_kt, qk_scale, cap, d, d_mask,
            BLOCK_SIZE, BLOCK_N, True, PRECISION, SOFTCAP, HEAD_DIM, QUANT,
        )  # fmt: skip

    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]
    if SINKS:
        sink = tl.load(sink_ptr + head, mask=r_mask, other=0.0)
        out = out * sink_share(m_i + tl.log2(safe_l), sink)[:, None]
    o_rows = (q_start + r // GROUP).to(tl.int64) * stride_ot + head * stride_oh
    o_ptrs = out_ptr + o_rows[:, None] + d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_prefill_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    cu_q: torch.Tensor,
    ctx_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_q_len: int | None = None,
    window: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of new tokens over their sequence's cached prefix and themselves.

    q: [tokens, heads, d]; kv: [blocks, layers, 2, block, kv_heads, d] (d + 8 bytes per row
    when quantized, ``engine.kv_format.rows``); cu_q: [batch + 1]
    int32 query offsets; ctx_lens: [batch] cached + new tokens; block_tables: [batch,
    max_blocks] int32. ``max_q_len`` (the longest query run) avoids a host sync when given.
    ``window`` > 0 is a sliding window: a query at position p sees keys in (p - window, p].
    ``softcap`` > 0 soft-caps each score at it (``softcap * tanh(score / softcap)``).
    ``sinks`` [heads] adds one logit per query head to each softmax (attention sinks).
    Returns [tokens, heads, d] in q's dtype.
    """
    view = kv_layer_view(kv, layer)
    check_attention_inputs(q, kv, view, cu_q=cu_q, ctx_lens=ctx_lens, block_tables=block_tables)
    tokens, heads, head_dim = q.shape
    batch = ctx_lens.shape[0]
    if cu_q.shape[0] != batch + 1:
        raise ValueError(f"cu_q must have batch + 1 = {batch + 1} entries, got {cu_q.shape[0]}")
    if window < 0:
        raise ValueError(f"window must be >= 0 (0: full attention), got {window}")
    sink = sink_logits(sinks, q)
    out = torch.empty_like(q)
    if tokens == 0 or batch == 0:
        return out
    if max_q_len is None:
        max_q_len = int((cu_q[1:] - cu_q[:-1]).max())
    group = heads // view.num_kv_heads
    small = interpreted(q)
    block_m = 16 if small else 128
    block_n = 16 if small else 64
    grid = (triton.cdiv(max_q_len * group, block_m), batch, view.num_kv_heads)
    codes, params = cache_views(kv)
    _prefill_kernel[grid](
        q, codes, params, cu_q, ctx_lens, block_tables, out, sink,
        scale * _LOG2E, window, softcap * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        view.layer_offset, view.v_offset, view.block_stride, view.token_stride,
        view.head_stride,
        BLOCK_SIZE=view.block_size, GROUP=group, HEAD_DIM=head_dim,
        HEAD_PAD=pow2(head_dim, 16), BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION=dot_precision(q.dtype), SOFTCAP=softcap > 0, QUANT=view.quant,
        SINKS=sinks is not None, num_warps=4 if head_dim <= 64 else 8, num_stages=3,
    )  # fmt: skip
    return out
