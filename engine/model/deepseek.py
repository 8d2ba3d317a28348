"""What a DeepSeek-V2 / V3 ``config.json`` means to the engine: multi-head latent attention
(``MlaSpec``), its score scale under YaRN, and the MoE layers with grouped top-k routing and
shared experts after ``first_k_dense_replace`` dense ones. The values come out as a dict of
``ModelConfig`` fields (``engine.model.families`` adds the baseline's). V3's multi-token
prediction layers (``num_nextn_predict_layers``, after the decoder's) are not read."""

from __future__ import annotations

import math
from typing import Any

from engine.model.config_fields import Fields
from engine.model.specs import MlaSpec, MoeSpec

# topk_method -> how expert groups are ranked ("": no groups); V3's "noaux_tc" is its own
TOPK_METHODS = {"greedy": "", "group_limited_greedy": "max", "noaux_tc": "top2"}


def parse_deepseek(fields: Fields, layers: int, v3: bool) -> dict[str, Any]:
    """MLA and MoE values of a DeepSeek-V2 (``v3`` False) or V3 config."""
    if fields.raw.get("attention_bias"):
        raise fields.refuse("attention_bias", "DeepSeek's projections have no biases")
    freq = fields.optional_integer("moe_layer_freq", 1)
    if freq != 1:
        raise fields.refuse("moe_layer_freq", "every layer after the dense ones is MoE")
    mla = parse_mla(fields, v3)
    return {
        "mla": mla,
        "num_key_value_heads": 1,  # the latent: one "head" every query head reads
        "head_dim": mla.latent_dim,
        "attention_scale": _scale(fields, mla),
        "moe": _moe(fields, layers, v3),
    }


def parse_mla(fields: Fields, v3: bool) -> MlaSpec:
    """The latent attention's shape; V2 rotates interleaved pairs, V3 as ``rope_interleave``
    says (default: interleaved)."""
    try:
        return MlaSpec(
            q_lora_rank=fields.optional_integer("q_lora_rank", 0),
            kv_lora_rank=fields.integer("kv_lora_rank"),
            qk_nope_head_dim=fields.integer("qk_nope_head_dim"),
            qk_rope_head_dim=fields.integer("qk_rope_head_dim"),
            v_head_dim=fields.integer("v_head_dim"),
            rope_interleave=bool(fields.raw.get("rope_interleave", True)) if v3 else True,
        )
    except ValueError as exc:
        raise fields.error(str(exc)) from None


def _scale(fields: Fields, mla: MlaSpec) -> float:
    """qk_head_dim ** -0.5, times YaRN's mscale squared where ``mscale_all_dim`` is set."""
    rope = fields.raw.get("rope_parameters") or fields.raw.get("rope_scaling") or {}
    scale = mla.qk_head_dim**-0.5
    kind = rope.get("rope_type", rope.get("type", "default"))
    all_dim, factor = rope.get("mscale_all_dim") or 0, rope.get("factor") or 1.0
    if kind != "default" and all_dim and factor > 1:
        mscale = 0.1 * all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


def _moe(fields: Fields, layers: int, v3: bool) -> MoeSpec:
    dense = fields.optional_integer("first_k_dense_replace", 0)
    method = fields.raw.get("topk_method") or ("noaux_tc" if v3 else "greedy")
    if method not in TOPK_METHODS or (method == "noaux_tc") != v3:
        raise fields.refuse("topk_method", "V2: greedy or group_limited_greedy; V3: noaux_tc")
    scoring = "sigmoid" if v3 else "softmax"
    if fields.raw.get("scoring_func", scoring) != scoring:
        raise fields.refuse("scoring_func", f"this architecture scores with {scoring}")
    group_score = TOPK_METHODS[method]
    grouped = bool(group_score)
    try:
        return MoeSpec(
            num_experts=fields.integer("n_routed_experts"),
            top_k=fields.integer("num_experts_per_tok"),
            intermediate_size=fields.integer("moe_intermediate_size"),
            normalize=bool(fields.raw.get("norm_topk_prob", False)),
            shared_intermediate_size=(
                fields.optional_integer("n_shared_experts", 0)
                * fields.integer("moe_intermediate_size")
            ),
            layers=tuple(range(dense, layers)),
            naming="deepseek",
            scoring=scoring,
            group_score=group_score,
            num_groups=fields.integer("n_group") if grouped else 1,
            topk_groups=fields.integer("topk_group") if grouped else 1,
            scaling=fields.optional_number("routed_scaling_factor", 1.0),
            correction_bias=v3,
            shared_gate=False,
        )
    except ValueError as exc:
        raise fields.error(str(exc)) from None
