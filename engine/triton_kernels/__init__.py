"""Triton kernels of the GPU attention backend, behind torch-friendly entry points.

Kernel modules import triton lazily, at first use: ``TRITON_INTERPRET=1`` must be set before
triton is first imported for the kernels to run on CPU tensors (the tests do this).

Shapes (d = head_dim):
- kv: [num_blocks, num_layers, 2, block_size, kv_heads, d], the whole cache, never copied.
- paged_decode_attention: q [batch, heads, d], block_tables [batch, max_blocks] int32,
  ctx_lens [batch] -> [batch, heads, d].
- paged_prefill_attention: q [tokens, heads, d], cu_q [batch + 1] int32, ctx_lens [batch]
  (cached + new), block_tables [batch, max_blocks] int32 -> [tokens, heads, d]. The new
  tokens' K/V must be written first (write_kv).
- Both attentions take ``window``: 0 is full causal attention; > 0 a sliding window, a
  query at position p sees the keys at (p - window, p]; and ``sinks`` [heads]: one more
  logit per query head in each softmax's denominator (gpt-oss), None for none.
- write_kv: k, v [tokens, kv_heads, d], slot_mapping [tokens] int64; a token whose slot is
  ``PAD_SLOT`` (negative: a CUDA graph's padding row) writes nothing, in rope_write_kv too.
- rms_norm: x, residual [tokens, hidden], weight [hidden] -> (out, new_residual).
- apply_rope: q [tokens, heads, d], k [tokens, kv_heads, d], positions [tokens],
  cos_sin_cache [max_position, d] (cos half | sin half) -> (q, k), rotated in place.
- rope_write_kv: apply_rope and write_kv in one kernel (v [tokens, kv_heads, d] as well).
Outputs are in q's (or x's) dtype; softmax and norms accumulate in fp32.
A quantized cache (``kv_cache_dtype`` int8 / fp8_e4m3: rows of d + 8 bytes, engine.kv_format.rows)
is taken as it is: the writers quantize rows, the attentions dequantize them in registers
(``kv_quant``); q is then any float dtype.
"""

from __future__ import annotations

import importlib.util
import os

import torch

PAD_SLOT = -1  # a token's slot that writes nothing (engine.step.graphs' padding rows)


def triton_available() -> bool:
    """True when the kernels can run here: triton importable, and CUDA or the interpreter."""
    if importlib.util.find_spec("triton") is None:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


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
    """Decode attention, one query per sequence; see ``decode_attention``."""
    from engine.triton_kernels.decode_attention import paged_decode_attention as impl

    return impl(
        q, kv, layer, block_tables, ctx_lens, scale, num_splits, max_ctx_len, window, softcap,
        sinks,
    )  # fmt: skip


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
    """Prefill attention over cached prefix + new tokens; see ``prefill_attention``."""
    from engine.triton_kernels.prefill_attention import paged_prefill_attention as impl

    return impl(
        q, kv, layer, cu_q, ctx_lens, block_tables, scale, max_q_len, window, softcap, sinks
    )


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
    """MLA's absorbed attention over the latent cache, decodes and prefill chunks in one
    launch; see ``mla_attention``."""
    from engine.triton_kernels.mla_attention import paged_mla_attention as impl

    return impl(q, kv, layer, cu_q, ctx_lens, block_tables, kv_lora, scale, max_q_len)


def write_kv(
    k: torch.Tensor, v: torch.Tensor, kv: torch.Tensor, layer: int, slot_mapping: torch.Tensor
) -> None:
    """Scatter new K / V into the paged cache in place; see ``kv_write``."""
    from engine.triton_kernels.kv_write import write_kv as impl

    impl(k, v, kv, layer, slot_mapping)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add + RMSNorm; see ``norm``."""
    from engine.triton_kernels.norm import rms_norm as impl

    return impl(x, weight, eps, residual)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half RoPE on q and k in place; see ``rope``."""
    from engine.triton_kernels.rope import apply_rope as impl

    return impl(q, k, positions, cos_sin_cache)


def rope_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    slot_mapping: torch.Tensor,
) -> None:
    """``apply_rope`` then ``write_kv`` in one kernel; see ``rope``."""
    from engine.triton_kernels.rope import rope_write_kv as impl

    impl(q, k, v, positions, cos_sin_cache, kv, layer, slot_mapping)


__all__ = [
    "PAD_SLOT",
    "apply_rope",
    "paged_decode_attention",
    "paged_mla_attention",
    "paged_prefill_attention",
    "rms_norm",
    "rope_write_kv",
    "triton_available",
    "write_kv",
]
