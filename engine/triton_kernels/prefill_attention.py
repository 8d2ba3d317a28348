"""Paged prefill attention: new tokens of many sequences over cached prefix + themselves.

Flattened batch: the queries of sequence ``b`` are rows ``cu_q[b]:cu_q[b+1]`` of ``q``; their
absolute positions end at ``ctx_lens[b] - 1``. The new tokens' K/V must already be written to
the cache (``write_kv``), so prefix and new keys are read the same way, through the block
table. The grid is (query tile, sequence, head); each program runs an online softmax over the
keys up to its last query's position, with the causal mask on the diagonal tiles only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.triton_kernels.layout import (
    check_attention_inputs,
    dot_precision,
    interpreted,
    kv_layer_view,
    pow2,
)

_LOG2E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    q_ptr,  # [tokens, heads, d]
    kv_ptr,  # the whole cache
    cu_q_ptr,  # [batch + 1] int32
    ctx_ptr,  # [batch]
    bt_ptr,  # [batch, max_blocks] int32
    out_ptr,  # [tokens, heads, d]
    qk_scale,  # softmax scale * log2(e)
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
):
    tile_m = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    ctx_len = tl.load(ctx_ptr + seq).to(tl.int32)
    prefix = ctx_len - q_len

    m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < q_len
    q_pos = prefix + m  # [BLOCK_M] absolute positions
    d = tl.arange(0, HEAD_PAD)
    d_mask = d < HEAD_DIM
    q_mask = m_mask[:, None] & d_mask[None, :]
    rows = (q_start + m).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + head * stride_qh + d[None, :], mask=q_mask, other=0.0
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_btb
    head_base = layer_offset + (head // GROUP) * stride_kh
    # Keys past the tile's last query are never needed; an empty tile loops zero times.
    kv_end = tl.where(
        tile_m * BLOCK_M < q_len, tl.minimum(ctx_len, prefix + (tile_m + 1) * BLOCK_M), 0
    )
    for tile in range(0, kv_end, BLOCK_N):
        tok = tile + tl.arange(0, BLOCK_N)
        t_mask = tok < kv_end
        block = tl.load(bt_row + tok // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        row = head_base + block * stride_kb + (tok % BLOCK_SIZE) * stride_kt  # [BLOCK_N]
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(kv_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        allowed = t_mask[None, :] & (tok[None, :] <= q_pos[:, None])
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(kv_ptr + v_offset + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = out_ptr + rows[:, None] * stride_ot + head * stride_oh + d[None, :]
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
) -> torch.Tensor:
    """Causal attention of new tokens over their sequence's cached prefix and themselves.

    q: [tokens, heads, d]; kv: [blocks, layers, 2, block, kv_heads, d]; cu_q: [batch + 1]
    int32 query offsets; ctx_lens: [batch] cached + new tokens; block_tables: [batch,
    max_blocks] int32. ``max_q_len`` (the longest query run) avoids a host sync when given.
    Returns [tokens, heads, d] in q's dtype.
    """
    view = kv_layer_view(kv, layer)
    check_attention_inputs(q, kv, view, cu_q=cu_q, ctx_lens=ctx_lens, block_tables=block_tables)
    tokens, heads, head_dim = q.shape
    batch = ctx_lens.shape[0]
    if cu_q.shape[0] != batch + 1:
        raise ValueError(f"cu_q must have batch + 1 = {batch + 1} entries, got {cu_q.shape[0]}")
    out = torch.empty_like(q)
    if tokens == 0 or batch == 0:
        return out
    if max_q_len is None:
        max_q_len = int((cu_q[1:] - cu_q[:-1]).max())
    small = interpreted(q)
    block_m = 16 if small else 64
    block_n = 16 if small else 64
    grid = (triton.cdiv(max_q_len, block_m), batch, heads)
    _prefill_kernel[grid](
        q, kv, cu_q, ctx_lens, block_tables, out,
        scale * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        view.layer_offset, view.v_offset, view.block_stride, view.token_stride,
        view.head_stride,
        BLOCK_SIZE=view.block_size, GROUP=heads // view.num_kv_heads, HEAD_DIM=head_dim,
        HEAD_PAD=pow2(head_dim, 16), BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION=dot_precision(q.dtype), num_warps=4, num_stages=2,
    )  # fmt: skip
    return out
