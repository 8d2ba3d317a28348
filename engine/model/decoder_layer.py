"""One decoder layer: a norm, the token mixer (``attention_layer``: self-attention, MLA's
latent attention, Qwen3-Next's gated attention or Gated DeltaNet), a norm and an MLP (gated,
or mixture of experts on a family's sparse layers), with Gemma's sandwich norms where set."""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import nn

from engine.model.attention import AttentionBackend, AttentionMetadata
from engine.model.config import ModelConfig
from engine.model.gated_attention import GatedAttention
from engine.model.gated_delta import GatedDeltaNet
from engine.model.layer_ops import LayerOps
from engine.model.layers import GatedMlp, Packed, SelfAttention, optional_weight, weight
from engine.model.mla import LatentAttention
from engine.model.moe import SparseMoe
from engine.model.moe_names import checkpoint_naming
from engine.model.moe_names import weight_targets as moe_weight_targets
from engine.model.routing import Router
from engine.model.shard import Shard, experts


def attention_layer(
    config: ModelConfig,
    index: int,
    dtype: torch.dtype,
    device: torch.device | str,
    cache_index: int | None,
) -> SelfAttention | LatentAttention | GatedDeltaNet:
    """The layer's token mixer: latent (MLA), linear (Gated DeltaNet), gated or plain
    attention. A hybrid model's cache holds only its attention layers, in order; a linear
    layer's state sits at its place among the linear layers."""
    if config.linear is not None:
        if config.is_linear_layer(index):
            return GatedDeltaNet(config, index, dtype, device, config.linear.layers.index(index))
        cache_index = config.kv_layers.index(index)
    if config.mla is not None:
        return LatentAttention(config, index, dtype, device, cache_index)
    attention = GatedAttention if config.attn_output_gate else SelfAttention
    return attention(config, index, dtype, device, cache_index)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        index: int,
        dtype: torch.dtype,
        device: torch.device | str,
        shard: Shard | None = None,
        cache_index: int | None = None,
    ) -> None:
        """``config``: the rank's (``engine.model.shard.shard_config``) with a ``shard``;
        the attention and MLP outputs are then partial sums, added up over the ranks.
        ``cache_index``: the layer's place in a pipeline stage's KV cache."""
        super().__init__()
        hidden, sandwich = config.hidden_size, config.sandwich_norms
        self.shard = shard or Shard()
        self.index = index
        self.eps = config.rms_norm_eps
        self.input_norm = weight(hidden, dtype=dtype, device=device)
        self.attn = attention_layer(config, index, dtype, device, cache_index)
        self.attn_out_norm = optional_weight(sandwich, hidden, dtype=dtype, device=device)
        self.mlp_norm = weight(hidden, dtype=dtype, device=device)
        self.mlp_out_norm = optional_weight(sandwich, hidden, dtype=dtype, device=device)
        self.mlp: GatedMlp | None = None
        self.moe: SparseMoe | None = None
        if config.moe is not None and config.is_moe_layer(index):
            spec = config.moe
            self.moe = SparseMoe(
                hidden, spec.intermediate_size, spec.num_experts, spec.top_k, spec.normalize,
                config.activation, spec.shared_intermediate_size, dtype=dtype, device=device,
                local=experts(self.shard, spec.num_experts), router=Router.of(spec),
                shared_gate=spec.shared_gate, correction_bias=spec.correction_bias,
                router_bias=spec.router_bias, expert_bias=spec.expert_bias, swiglu=spec.swiglu,
                expert_format=spec.expert_format,
            )  # fmt: skip
            self.moe_naming = spec.naming
        else:
            self.mlp = GatedMlp(
                hidden, config.intermediate_size, config.activation, config.naming, dtype, device
            )

    def pack_cpu_weights(self) -> None:
        self.attn.pack_cpu_weights()
        if self.mlp is not None:
            self.mlp.pack_cpu_weights()
        if self.moe is not None:
            self.moe.pack_cpu_weights()

    def forward(
        self,
        h: torch.Tensor,
        ops_by_rope: list[LayerOps],
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        attention: AttentionBackend,
    ) -> torch.Tensor:
        """h: [tokens, hidden] -> [tokens, hidden], the residual stream, updated in place."""
        ops = ops_by_rope[self.attn.rope_index]
        x = ops.norm(h, self.input_norm, self.eps)
        o = self.attn.attend(x, ops, kv_cache, meta, attention)
        h = self._add(h, o, self.attn, "o_proj", self.attn.o_bias, self.attn_out_norm, ops)
        x = ops.norm(h, self.mlp_norm, self.eps)
        if self.moe is not None:
            y = self.shard.all_reduce_(self.moe(x, ops.backend))
            if self.mlp_out_norm is not None:
                y = ops.norm(y, self.mlp_out_norm, self.eps)
            return h.add_(y)
        assert self.mlp is not None
        a = self.mlp.hidden_act(x, ops)
        return self._add(h, a, self.mlp, "down", None, self.mlp_out_norm, ops)

    def _add(
        self,
        h: torch.Tensor,
        x: torch.Tensor,
        module: Packed,
        name: str,
        bias: torch.Tensor | None,
        out_norm: torch.Tensor | None,
        ops: LayerOps,
    ) -> torch.Tensor:
        """h += W x (+ bias), normed first when the family norms the branch's output; with
        tensor parallelism W x is summed over the ranks first, the bias added once."""
        if out_norm is None and self.shard.size == 1:
            return module.add_project_(h, x, name, bias)
        y = self.shard.all_reduce_(module.project(x, name, None))
        if bias is not None:
            y.add_(bias)
        return h.add_(y if out_norm is None else ops.norm(y, out_norm, self.eps))

    def norm_weights(self) -> list[torch.Tensor]:
        """Every RMSNorm weight of the layer (Gemma's (1 + w) offset applies to all)."""
        norms = (self.input_norm, self.attn_out_norm, self.mlp_norm, self.mlp_out_norm)
        return [n.data for n in norms if n is not None] + self.attn.norm_weights()

    def weight_targets(
        self, prefix: str, names: Collection[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """HF tensor name -> the weight (or fused slice) it fills; ``names``, the
        checkpoint's tensor names, tell an expert layout from another where one can differ."""
        targets = {prefix + "input_layernorm.weight": self.input_norm.data}
        if self.attn_out_norm is not None and self.mlp_out_norm is not None:
            targets[prefix + "post_attention_layernorm.weight"] = self.attn_out_norm.data
            targets[prefix + "pre_feedforward_layernorm.weight"] = self.mlp_norm.data
            targets[prefix + "post_feedforward_layernorm.weight"] = self.mlp_out_norm.data
        else:
            targets[prefix + "post_attention_layernorm.weight"] = self.mlp_norm.data
        targets |= self.attn.weight_targets(prefix)
        if self.moe is not None:
            naming = checkpoint_naming(names or (), prefix, self.moe_naming)
            return targets | moe_weight_targets(self.moe, prefix, naming)
        assert self.mlp is not None
        return targets | self.mlp.weight_targets(prefix)
