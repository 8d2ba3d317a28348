"""Multi-head latent attention (DeepSeek-V2 / V3), the layer object that stands in for
``SelfAttention`` when a family sets ``ModelConfig.mla``.

q comes through a low-rank bottleneck (``q_a_proj``, its norm, ``q_b_proj``) or one
``q_proj``; ``kv_a_proj_with_mqa`` gives each token its latent (normed by
``kv_a_layernorm``) and one rotary key every head shares. The cache stores only those
(``latent_dim`` values a token and layer: one KV "head", replicated on every
tensor-parallel rank); ``kv_b_proj`` turns a latent into each head's key and value, absorbed
into the queries and the output for decodes (``engine.model.mla_attention``).
"""

from __future__ import annotations

import torch

from engine.kv_format.rows import write_plane
from engine.model.attention import AttentionBackend, AttentionMetadata
from engine.model.config import ModelConfig
from engine.model.layer_ops import LayerOps
from engine.model.layers import Packed, optional_weight, weight
from engine.model.mla_attention import Absorbed, LatentQuery, latent_attention


class LatentAttention(Packed):
    """MLA over the latent cache: the rank's query heads, the whole latent."""

    def __init__(
        self,
        config: ModelConfig,
        index: int,
        dtype: torch.dtype,
        device: torch.device | str,
        cache_index: int | None = None,
    ) -> None:
        super().__init__()
        mla = config.mla
        assert mla is not None
        self.mla, self.eps, self.scale = mla, config.rms_norm_eps, config.attention_scale
        self.index = index if cache_index is None else cache_index
        self.num_heads = heads = config.num_attention_heads
        self.rope_index, self.o_bias = 0, None
        hidden, lora = config.hidden_size, mla.q_lora_rank
        self.MATRICES = ("q_a", "q_b", "kv_a", "o_proj") if lora else ("q_b", "kv_a", "o_proj")
        self.q_a = optional_weight(bool(lora), lora, hidden, dtype=dtype, device=device)
        self.q_a_norm = optional_weight(bool(lora), lora, dtype=dtype, device=device)
        self.q_b = weight(heads * mla.qk_head_dim, lora or hidden, dtype=dtype, device=device)
        self.kv_a = weight(mla.latent_dim, hidden, dtype=dtype, device=device)
        self.kv_a_norm = weight(mla.kv_lora_rank, dtype=dtype, device=device)
        kv_b_rows = heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        self.kv_b = weight(kv_b_rows, mla.kv_lora_rank, dtype=dtype, device=device)
        self.o_proj = weight(hidden, heads * mla.v_head_dim, dtype=dtype, device=device)

    def attend(
        self,
        x: torch.Tensor,
        ops: LayerOps,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        attention: AttentionBackend,
    ) -> torch.Tensor:
        """x: [tokens, hidden] (normed) -> [tokens, heads * v_head_dim], the output
        projection's input; this step's latent rows are stored in the cache on the way."""
        mla, tokens = self.mla, x.shape[0]
        q = self._query(x, ops).view(tokens, self.num_heads, mla.qk_head_dim)
        ckv = self.project(x, "kv_a", None)  # [tokens, latent_dim]
        c = ops.norm(ckv[:, : mla.kv_lora_rank].contiguous(), self.kv_a_norm, self.eps)
        q_pe = ops.rope(self._pairs(q[..., mla.qk_nope_head_dim :]), meta)
        k_pe = ops.rope(self._pairs(ckv[:, None, mla.kv_lora_rank :]), meta)  # [tokens, 1, r]
        rows = torch.cat((c[:, None], k_pe), dim=-1)  # [tokens, 1, latent_dim]
        write_plane(kv_cache, self.index, 0, rows, meta.slot_mapping)
        query = LatentQuery(q[..., : mla.qk_nope_head_dim], q_pe, rows)
        weights = Absorbed.split(self.kv_b, self.num_heads, mla.qk_nope_head_dim)
        o = latent_attention(query, weights, kv_cache, self.index, meta, self.scale, attention)
        return o.reshape(tokens, -1)

    def _query(self, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:
        if self.q_a is None or self.q_a_norm is None:
            return self.project(x, "q_b", None)
        return self.project(
            ops.norm(self.project(x, "q_a", None), self.q_a_norm, self.eps), "q_b", None
        )

    def _pairs(self, x: torch.Tensor) -> torch.Tensor:
        """The rotary part in the rotate-half order: DeepSeek's checkpoints rotate
        interleaved pairs (x0, x1), (x2, x3), ..., which is rotate-half of the evens then
        the odds (transformers computes it so)."""
        if not self.mla.rope_interleave:
            return x
        return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)

    def norm_weights(self) -> list[torch.Tensor]:
        return [n.data for n in (self.q_a_norm, self.kv_a_norm) if n is not None]

    def weight_targets(self, prefix: str) -> dict[str, torch.Tensor]:
        p = prefix + "self_attn."
        targets = {
            p + "kv_a_proj_with_mqa.weight": self.kv_a.data,
            p + "kv_a_layernorm.weight": self.kv_a_norm.data,
            p + "kv_b_proj.weight": self.kv_b.data,
            p + "o_proj.weight": self.o_proj.data,
        }
        if self.q_a is None or self.q_a_norm is None:
            return targets | {p + "q_proj.weight": self.q_b.data}
        return targets | {
            p + "q_a_proj.weight": self.q_a.data,
            p + "q_a_layernorm.weight": self.q_a_norm.data,
            p + "q_b_proj.weight": self.q_b.data,
        }
