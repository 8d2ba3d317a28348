"""What a Qwen3-Next ``config.json`` means to the engine: Gated DeltaNet linear-attention
layers (``LinearAttnSpec``) interleaved with full-attention layers whose output is gated
(``attn_output_gate``) and whose rotary turns only ``partial_rotary_factor`` of each head.
The values come out as a dict of ``ModelConfig`` fields (``engine.model.families`` adds the
baseline's, the q/k norms and the MoE with its gated shared expert)."""

from __future__ import annotations

from typing import Any

from engine.model.config_fields import Fields, rotary_dims
from engine.model.specs import LinearAttnSpec

LAYER_KINDS = ("linear_attention", "full_attention")
PARTIAL_ROTARY_DEFAULT = 0.25  # transformers' Qwen3NextConfig


def parse_qwen3_next(fields: Fields, layers: int, head_dim: int) -> dict[str, Any]:
    """The linear-attention layers, the gate on attention and the rotary share."""
    types = _layer_types(fields, layers)
    if "full_attention" not in types:
        raise fields.error("layer_types has no full_attention layer (the KV cache needs one)")
    if fields.raw.get("hidden_act", "silu") != "silu":
        raise fields.refuse("hidden_act", "the linear attention's conv runs SiLU")
    try:
        spec = LinearAttnSpec(
            layers=tuple(i for i, kind in enumerate(types) if kind == "linear_attention"),
            num_k_heads=fields.integer("linear_num_key_heads"),
            num_v_heads=fields.integer("linear_num_value_heads"),
            k_head_dim=fields.integer("linear_key_head_dim"),
            v_head_dim=fields.integer("linear_value_head_dim"),
            conv_kernel=fields.integer("linear_conv_kernel_dim"),
        )
    except ValueError as exc:
        raise fields.error(str(exc)) from None
    dims = rotary_dims(fields, head_dim, PARTIAL_ROTARY_DEFAULT)
    return {"linear": spec, "attn_output_gate": True, "rope_dims": dims}


def _layer_types(fields: Fields, layers: int) -> list[str]:
    """``layer_types``, else every ``full_attention_interval``-th layer full (transformers')."""
    types = fields.raw.get("layer_types")
    if types is None:
        every = fields.optional_integer("full_attention_interval", 4)
        return [
            "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)
        ]
    if not isinstance(types, list) or len(types) != layers:
        raise fields.error(f"'layer_types' must list {layers} layers, got {types!r}")
    for kind in types:
        if kind not in LAYER_KINDS:
            raise fields.error(
                f"layer_types has {kind!r}, not supported (supported: {', '.join(LAYER_KINDS)})"
            )
    return types
