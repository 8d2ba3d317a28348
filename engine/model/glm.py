"""What a GLM-4.5 / 4.6 MoE (``Glm4MoeForCausalLM``) ``config.json`` means to the engine: a
rotary over part of each head (``partial_rotary_factor``, half by default), per-head q/k
norms where ``use_qk_norm``, q/k/v biases (``attention_bias``; the output has none), and
DeepSeek-V3's MoE after ``first_k_dense_replace`` dense layers: sigmoid scores with the
correction bias, grouped top-k, ``routed_scaling_factor`` and shared experts. The
multi-token prediction layers (``num_nextn_predict_layers``, after the decoder's) are not
read. The values come out as a dict of ``ModelConfig`` fields."""

from __future__ import annotations

from typing import Any

from engine.model.config_fields import Fields, rotary_dims
from engine.model.specs import MoeSpec

PARTIAL_ROTARY_DEFAULT = 0.5  # transformers' Glm4MoeConfig sets it when the config does not


def parse_glm4_moe(fields: Fields, layers: int, head_dim: int) -> dict[str, Any]:
    """The attention options and the MoE of a GLM-4.5 MoE config (the baseline's added by
    the caller)."""
    return {
        "qkv_bias": bool(fields.raw.get("attention_bias", False)),
        "o_bias": False,
        "qk_norm": bool(fields.raw.get("use_qk_norm", False)),
        "rope_dims": rotary_dims(fields, head_dim, PARTIAL_ROTARY_DEFAULT),
        "moe": _moe(fields, layers),
    }


def _moe(fields: Fields, layers: int) -> MoeSpec:
    experts = fields.integer("n_routed_experts")
    inter = fields.integer("moe_intermediate_size")
    try:
        return MoeSpec(
            num_experts=experts,
            top_k=fields.integer("num_experts_per_tok"),
            intermediate_size=inter,
            normalize=bool(fields.raw.get("norm_topk_prob", True)),
            shared_intermediate_size=fields.optional_integer("n_shared_experts", 1) * inter,
            layers=tuple(range(fields.optional_integer("first_k_dense_replace", 1), layers)),
            naming="deepseek",
            scoring="sigmoid",
            group_score="top2",
            num_groups=fields.optional_integer("n_group", 1),
            topk_groups=fields.optional_integer("topk_group", 1),
            scaling=fields.optional_number("routed_scaling_factor", 1.0),
            correction_bias=True,
            shared_gate=False,
        )
    except ValueError as exc:
        raise fields.error(str(exc)) from None
