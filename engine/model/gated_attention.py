"""Qwen3-Next's full attention: ``SelfAttention`` whose ``q_proj`` gives each head a query
and an output gate (side by side per head), the output scaled by sigmoid(gate) before the
output projection, and a rotary over only the first ``rope_dims`` values of each head."""

from __future__ import annotations

import torch

from engine.kv_format.rows import rotate_heads_, rotates_keys, write_kv
from engine.model.attention import AttentionBackend, AttentionMetadata
from engine.model.config import ModelConfig
from engine.model.layer_ops import LayerOps
from engine.model.layers import SelfAttention, optional_weight, weight
from engine.model.rope import partial_rotary_order


class GatedAttention(SelfAttention):
    """Gated, partially rotary grouped-query attention over the paged cache."""

    def __init__(
        self,
        config: ModelConfig,
        index: int,
        dtype: torch.dtype,
        device: torch.device | str,
        cache_index: int | None = None,
    ) -> None:
        super().__init__(config, index, dtype, device, cache_index)
        rows, hidden = 2 * self.q_size + 2 * self.kv_size, config.hidden_size
        self.qkv = weight(rows, hidden, dtype=dtype, device=device)
        self.qkv_bias = optional_weight(config.qkv_bias, rows, dtype=dtype, device=device)
        self.head_dim = config.head_dim
        # a partial rotary's pairs moved to a whole head's places (rope.partial_rotary_order)
        self.head_order = (
            partial_rotary_order(config.head_dim, config.rope_dims).to(device)
            if config.partial_rotary
            else None
        )

    def attend(
        self,
        x: torch.Tensor,
        ops: LayerOps,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        attention: AttentionBackend,
    ) -> torch.Tensor:
        """x: [tokens, hidden] (normed) -> [tokens, heads * d], the gated attention output;
        this step's K and V are stored in the cache on the way."""
        tokens, d, heads, kv_heads = x.shape[0], self.head_dim, self.num_heads, self.num_kv_heads
        qkv = self.project(x, "qkv", self.qkv_bias)  # [tokens, 2 q + 2 kv]
        q_end = 2 * self.q_size
        qg = qkv[:, :q_end].view(tokens, heads, 2 * d)
        q, gate = qg[..., :d].reshape(tokens, -1), qg[..., d:]  # [tokens, q], [tokens, h, d]
        k = qkv[:, q_end : q_end + self.kv_size]
        if self.q_norm is not None and self.k_norm is not None:
            ops.head_norm_(q, heads, self.q_norm, self.eps)
            ops.head_norm_(k, kv_heads, self.k_norm, self.eps)
        q = self._rotate(q.view(tokens, heads, d), ops, meta)
        k = self._rotate(k.reshape(tokens, kv_heads, d), ops, meta)
        if rotates_keys(kv_cache):  # keys stored rotated, queries rotated alike
            rotate_heads_(q)
            rotate_heads_(k)
        v = qkv[:, q_end + self.kv_size :].reshape(tokens, kv_heads, d)
        write_kv(kv_cache, self.index, k, v, meta.slot_mapping)
        o = attention(q, k, v, kv_cache, self.index, meta, self.spec)  # [tokens, heads, d]
        return o.mul_(torch.sigmoid(gate)).reshape(tokens, -1)

    def _rotate(self, x: torch.Tensor, ops: LayerOps, meta: AttentionMetadata) -> torch.Tensor:
        """x [tokens, heads, d] turned by the layer's rotary table (a new tensor): with a
        partial rotary, q and k alike in ``head_order`` first, which leaves q.k unchanged."""
        if self.head_order is not None:
            x = x.index_select(-1, self.head_order)
        return ops.rope(x.contiguous(), meta)
