"""Paged decode attention, flash-decoding style.

One query token per sequence. The grid is (sequence, KV head, split): each program reads one
slice of one sequence's context for one KV head, once, and serves every query head of that GQA
group with a ``tl.dot`` (the group is padded to 16 rows, the minimum dot size). Splits write a
partial output and a log2-sum-exp; a second kernel merges them. With one split the first
kernel writes the output directly. With a sliding window the splits cover only the window's
keys, the last ``window`` tokens of each context. Attention sinks (gpt-oss: one learned logit
per query head) add one more term to each softmax's denominator: where the output is written,
after every split is merged, so a split never counts it twice. A quantized cache (int8 / fp8
e4m3 rows) is dequantized in registers as each tile is read, then cast to q's dtype for the
dots.
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
    sm_count,
    soft_cap,
)

_LOG2E = 1.4426950408889634
_MAX_SPLITS = 64


@triton.jit
def _decode_split_kernel(
    q_ptr,  # [batch, heads, d]
    kv_ptr,  # the whole cache (its bytes when QUANT)
    param_ptr,  # the cache as bf16 (scales and mids) when QUANT
    bt_ptr,  # [batch, max_blocks] int32
    ctx_ptr,  # [batch]
    out_ptr,  # [batch, heads, d], written when SINGLE
    sink_ptr,  # [heads] fp32 sink logits * log2(e), read when SINKS
    part_out_ptr,  # [batch, heads, splits, HEAD_PAD] fp32
    part_lse_ptr,  # [batch, heads, splits] fp32, log2 domain
    qk_scale,  # softmax scale * log2(e)
    window,  # 0: whole context; else its last `window` tokens
    cap,  # soft-cap of the scores * log2(e), used when SOFTCAP
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_btb,
    layer_offset,
    v_offset,
    stride_kb,
    stride_kt,
    stride_kh,
    num_splits,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    SINGLE: tl.constexpr,  # one split: write the output, skip the partials
    PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
    QUANT: tl.constexpr,  # 0: model dtype; 1: int8 rows; 2: fp8 e4m3 rows
    SINKS: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx_len = tl.load(ctx_ptr + seq).to(tl.int32)
    first = tl.where(window > 0, tl.maximum(ctx_len - window, 0), 0)  # first visible key
    # each sequence's keys cut into num_splits parts of whole tiles, by its own length: a
    # grid planned for a longer context (a CUDA graph's) still spreads a short one
    part = tl.cdiv(tl.cdiv(ctx_len - first, num_splits), TILE_N) * TILE_N
    start = first + split * part
    end = tl.minimum(start + part, ctx_len)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_PAD)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    q_mask = g_mask[:, None] & d_mask[None, :]
    q = tl.load(
        q_ptr + seq * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0
    )  # [GROUP_PAD, HEAD_PAD]

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_btb
    head_base = layer_offset + kv_head * stride_kh
    for tile in range(start, end, TILE_N):
        tok = tile + tl.arange(0, TILE_N)
        t_mask = tok < end
        block = tl.load(bt_row + tok // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        row = head_base + block * stride_kb + (tok % BLOCK_SIZE) * stride_kt  # [TILE_N]
        k = load_kv_tile(kv_ptr, param_ptr, row, d, t_mask, d_mask, HEAD_DIM, QUANT).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [GROUP_PAD, TILE_N]
        if SOFTCAP:
            s = soft_cap(s, cap)
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_kv_tile(kv_ptr, param_ptr, row + v_offset, d, t_mask, d_mask, HEAD_DIM, QUANT)
        v = v.to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]
    if SINGLE:
        if SINKS:
            sink = tl.load(sink_ptr + heads, mask=g_mask, other=0.0)
            out = out * sink_share(m_i + tl.log2(safe_l), sink)[:, None]
        o_ptrs = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        row_id = (seq * GROUP * tl.num_programs(1) + heads) * num_splits + split  # [GROUP_PAD]
        tl.store(part_out_ptr + row_id[:, None] * HEAD_PAD + d[None, :], out, mask=q_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))
        tl.store(part_lse_ptr + row_id, lse, mask=g_mask)


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr,  # [batch, heads, splits, HEAD_PAD] fp32
    part_lse_ptr,  # [batch, heads, splits] fp32
    out_ptr,  # [batch, heads, d]
    sink_ptr,  # [heads] fp32 sink logits * log2(e), read when SINKS
    stride_ob,
    stride_oh,
    num_splits,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    SINKS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_PAD)
    row0 = (seq * tl.num_programs(1) + head) * num_splits
    lse = tl.load(part_lse_ptr + row0 + s, mask=s < num_splits, other=float("-inf"))
    top = tl.max(lse, 0)
    weight = tl.exp2(lse - top)  # [SPLITS_PAD], empty splits weigh 0
    parts = tl.load(
        part_out_ptr + (row0 + s)[:, None] * HEAD_PAD + d[None, :],
        mask=(s < num_splits)[:, None],
        other=0.0,
    )  # [SPLITS_PAD, HEAD_PAD]
    out = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)
    if SINKS:
        total = top + tl.log2(tl.sum(weight, 0))  # log2 of the whole context's sum
        out = out * sink_share(total, tl.load(sink_ptr + head))
    o_ptrs = out_ptr + seq * stride_ob + head * stride_oh + d
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def plan_splits(batch: int, kv_heads: int, max_ctx: int, tile_n: int, device: torch.device) -> int:
    """Splits per sequence so that batch x kv_heads x splits fills the GPU a few times over."""
    if device.type != "cuda":
        return 1
    wanted = triton.cdiv(4 * sm_count(device), max(batch * kv_heads, 1))
    return max(1, min(wanted, triton.cdiv(max_ctx, tile_n), _MAX_SPLITS))


def paged_decode_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    max_ctx_len: int | None = None,
    window: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its paged context (itself included).

    q: [batch, heads, d]; kv: [blocks, layers, 2, block, kv_heads, d] (d + 8 bytes per row
    when quantized, ``engine.kv_format.rows``); block_tables:
    [batch, max_blocks] int32; ctx_lens: [batch], each >= 1 and <= max_blocks * block.
    Returns [batch, heads, d] in q's dtype. No host sync: the split plan uses ``max_ctx_len``
    (the batch's longest context, known to the scheduler) or else the block table's width,
    so pass one of them tight. ``num_splits`` overrides the plan (tests, benchmarks).
    ``window`` > 0 limits each query to the last ``window`` tokens of its context;
    ``softcap`` > 0 soft-caps each score at it (``softcap * tanh(score / softcap)``).
    ``sinks`` [heads] adds one logit per query head to each softmax (attention sinks).
    """
    if window < 0:
        raise ValueError(f"window must be >= 0 (0: full attention), got {window}")
    view = kv_layer_view(kv, layer)
    check_attention_inputs(q, kv, view, block_tables=block_tables, ctx_lens=ctx_lens)
    batch, heads, head_dim = q.shape
    sink = sink_logits(sinks, q)
    group = heads // view.num_kv_heads
    head_pad = pow2(head_dim, 16)
    tile_n = 16 if interpreted(q) else 64
    max_ctx = max_ctx_len or block_tables.shape[1] * view.block_size
    if window > 0:
        max_ctx = min(max_ctx, window)  # keys per sequence
    splits = num_splits or plan_splits(batch, view.num_kv_heads, max_ctx, tile_n, q.device)
    partition = triton.cdiv(triton.cdiv(max_ctx, splits), tile_n) * tile_n
    splits = triton.cdiv(max_ctx, partition)
    out = torch.empty_like(q)
    part_out = torch.empty((batch, heads, splits, head_pad), device=q.device, dtype=torch.float32)
    part_lse = torch.empty((batch, heads, splits), device=q.device, dtype=torch.float32)
    codes, params = cache_views(kv)
    _decode_split_kernel[(batch, view.num_kv_heads, splits)](
        q, codes, params, block_tables, ctx_lens, out, sink, part_out, part_lse,
        scale * _LOG2E, window, softcap * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        view.layer_offset, view.v_offset, view.block_stride, view.token_stride,
        view.head_stride, splits,
        BLOCK_SIZE=view.block_size, GROUP=group, GROUP_PAD=pow2(group, 16),
        HEAD_DIM=head_dim, HEAD_PAD=head_pad, TILE_N=tile_n, SINGLE=splits == 1,
        PRECISION=dot_precision(q.dtype), SOFTCAP=softcap > 0, QUANT=view.quant,
        SINKS=sinks is not None, num_warps=4, num_stages=2,
    )  # fmt: skip
    if splits > 1:
        _decode_reduce_kernel[(batch, heads)](
            part_out, part_lse, out, sink, out.stride(0), out.stride(1), splits,
            HEAD_DIM=head_dim, HEAD_PAD=head_pad, SPLITS_PAD=pow2(splits),
            SINKS=sinks is not None, num_warps=1,
        )  # fmt: skip
    return out
