"""Multi-head latent attention (DeepSeek-V2 / V3) over the paged latent cache, in the absorbed
form, for a step's decodes and prefill chunks in one launch.

Each cache row is a token's ``[c, k_pe]`` (``kv_lora`` + ``rope`` values, one KV "head" every
query head reads); each query head arrives projected into that space (``W_uk^T q_nope``, then
its rotated ``q_pe``). Scores are ``q . row``, the output ``sum_t p_t c_t`` stays in the
latent space (the caller up-projects it with ``W_uv``). The grid is (row tile, sequence): a
tile's rows are (query token, head) pairs of one sequence, so each latent tile is read once
for all of them, both products go through ``tl.dot``, and a decode (one token) is a tile of
its heads. The latent and rotary halves are loaded as two padded tiles (kv_lora and rope
need not add up to a power of two). The online softmax runs in fp32 in the log2 domain. A
quantized cache (int8 / fp8 e4m3 rows, two halves of the whole row each with a scale and a
mid) is dequantized in registers as each tile is read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.triton_kernels.kv_quant import cache_views, load_kv_tile, quant_code, row_head_dim
from engine.triton_kernels.layout import dot_precision, interpreted, pow2

_LOG2E = 1.4426950408889634


@triton.jit
def _mla_kernel(
    q_ptr,  # [tokens, heads, latent]
    kv_ptr,  # the whole cache (its bytes when QUANT)
    param_ptr,  # the cache as bf16 (scales and mids) when QUANT
    cu_q_ptr,  # [seqs + 1] int32
    ctx_ptr,  # [seqs]
    bt_ptr,  # [seqs, max_blocks] int32
    out_ptr,  # [tokens, heads, kv_lora]
    qk_scale,  # softmax scale * log2(e)
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_btb,
    layer_offset,
    stride_kb,
    stride_kt,
    HEADS: tl.constexpr,
    KV_LORA: tl.constexpr,
    LATENT: tl.constexpr,
    C_PAD: tl.constexpr,
    R_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    QUANT: tl.constexpr,  # 0: model dtype; 1: int8 rows; 2: fp8 e4m3 rows
):
    tile_m = tl.num_programs(0) - 1 - tl.program_id(0)  # the longest tiles start first
    seq = tl.program_id(1)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    prefix = tl.load(ctx_ptr + seq).to(tl.int32) - q_len
    rows = q_len * HEADS

    r = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    r_mask = r < rows
    q_pos = prefix + r // HEADS  # [BLOCK_M]
    q_rows = (q_start + r // HEADS).to(tl.int64) * stride_qt + (r % HEADS) * stride_qh
    c = tl.arange(0, C_PAD)
    e = tl.arange(0, R_PAD)
    c_mask = c < KV_LORA
    e_mask = e < LATENT - KV_LORA
    q_c = tl.load(
        q_ptr + q_rows[:, None] + c[None, :], mask=r_mask[:, None] & c_mask[None, :], other=0.0
    )  # [BLOCK_M, C_PAD]
    q_r = tl.load(
        q_ptr + q_rows[:, None] + KV_LORA + e[None, :],
        mask=r_mask[:, None] & e_mask[None, :],
        other=0.0,
    )  # [BLOCK_M, R_PAD]

    live = tile_m * BLOCK_M < rows
    kv_end = tl.where(live, prefix + (tl.minimum((tile_m + 1) * BLOCK_M, rows) - 1) // HEADS + 1, 0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, C_PAD], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_btb
    for start in range(0, kv_end, BLOCK_N):
        key = start + tl.arange(0, BLOCK_N)
        k_mask = key < kv_end
        block = tl.load(bt_row + key // BLOCK_SIZE, mask=k_mask, other=0).to(tl.int64)
        row = layer_offset + block * stride_kb + (key % BLOCK_SIZE) * stride_kt  # [BLOCK_N]
        kc = load_kv_tile(kv_ptr, param_ptr, row, c, k_mask, c_mask, LATENT, QUANT).to(q_c.dtype)
        kr = load_kv_tile(kv_ptr, param_ptr, row, KV_LORA + e, k_mask, e_mask, LATENT, QUANT)
        s = tl.dot(q_c, tl.trans(kc), input_precision=PRECISION)
        s += tl.dot(q_r, tl.trans(kr.to(q_r.dtype)), input_precision=PRECISION)
        seen = (key[None, :] <= q_pos[:, None]) & k_mask[None, :]
        s = tl.where(seen, s * qk_scale, float("-inf"))  # [BLOCK_M, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(s, 1))  # key 0 is in every row's first tile: finite
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kc.dtype), kc, input_precision=PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_rows = (q_start + r // HEADS).to(tl.int64) * stride_ot + (r % HEADS) * stride_oh
    o_mask = r_mask[:, None] & c_mask[None, :]
    tl.store(out_ptr + o_rows[:, None] + c[None, :], out.to(out_ptr.dtype.element_ty), mask=o_mask)


def paged_mla_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    cu_q: torch.Tensor,
    ctx_lens: torch.Tensor,
    block_tables: torch.Tensor,
    kv_lora: int,
    scale: float,
    max_q_len: int,
) -> torch.Tensor:
    """Causal attention of a step's absorbed queries over the latent cache.

    q: [tokens, heads, latent] (unit last stride); kv: [blocks, layers, 1, block, 1, latent]
    (latent + 8 bytes a row when quantized, ``engine.kv_format.rows``); cu_q: [seqs + 1]
    int32 query offsets from 0 (decodes are runs of one); ctx_lens: [seqs] cached + new
    tokens; block_tables: [seqs, max_blocks] int32; ``max_q_len``: the longest run. This
    step's rows must be in the cache. Returns [tokens, heads, kv_lora] in q's dtype.
    """
    tokens, heads, latent = q.shape
    _check(q, kv, layer, cu_q, ctx_lens, block_tables, kv_lora)
    out = q.new_empty(tokens, heads, kv_lora)
    if tokens == 0:
        return out
    block_m = 16 if interpreted(q) else 32
    block_n = 16 if interpreted(q) else 32
    grid = (triton.cdiv(max_q_len * heads, block_m), ctx_lens.shape[0])
    codes, params = cache_views(kv)
    _mla_kernel[grid](
        q, codes, params, cu_q, ctx_lens, block_tables, out, scale * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        layer * kv.stride(1), kv.stride(0), kv.stride(3),
        HEADS=heads, KV_LORA=kv_lora, LATENT=latent, C_PAD=pow2(kv_lora, 16),
        R_PAD=pow2(latent - kv_lora, 16), BLOCK_SIZE=kv.shape[3], BLOCK_M=block_m,
        BLOCK_N=block_n, PRECISION=dot_precision(q.dtype), QUANT=quant_code(kv),
        num_warps=4, num_stages=2,
    )  # fmt: skip
    return out


def _check(
    q: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    cu_q: torch.Tensor,
    ctx_lens: torch.Tensor,
    block_tables: torch.Tensor,
    kv_lora: int,
) -> None:
    """ValueError, naming the value, for inputs the kernel would misread."""
    if kv.dim() != 6 or kv.shape[2] != 1 or kv.shape[4] != 1:
        raise ValueError(
            f"kv must be a latent cache [blocks, layers, 1, block, 1, latent], got "
            f"{tuple(kv.shape)}"
        )
    if not 0 <= layer < kv.shape[1]:
        raise ValueError(f"layer {layer} out of range for a cache of {kv.shape[1]} layers")
    latent = row_head_dim(kv)
    if q.dim() != 3 or q.shape[2] != latent or not 0 < kv_lora < latent:
        raise ValueError(
            f"q {tuple(q.shape)} does not fit latent rows of {latent} (kv_lora {kv_lora})"
        )
    if cu_q.shape[0] != ctx_lens.shape[0] + 1 or block_tables.shape[0] != ctx_lens.shape[0]:
        raise ValueError(
            f"{ctx_lens.shape[0]} context lengths, {cu_q.shape[0]} query offsets, "
            f"{block_tables.shape[0]} block tables"
        )
    tensors = {"q": q, "kv": kv, "cu_q": cu_q, "ctx_lens": ctx_lens, "block_tables": block_tables}
    if len({t.device for t in tensors.values()}) > 1 or any(
        t.stride(-1) != 1 for t in tensors.values()
    ):
        raise ValueError("q, kv and the index tensors must share a device, last strides 1")
