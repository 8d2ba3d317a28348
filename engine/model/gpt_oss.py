"""What a gpt-oss ``config.json`` means to the engine: attention sinks and q/k/v/o biases,
sliding and full layers from ``layer_types``, and mixture-of-experts on every layer with a
router bias, expert biases and the clamped SwiGLU, the experts in the model dtype or packed
MXFP4 (``quantization_config.quant_method == "mxfp4"``). The values come out as a dict of
``ModelConfig`` fields (``engine.model.families`` adds the baseline's and the windows)."""

from __future__ import annotations

from typing import Any

from engine.model.config_fields import Fields
from engine.model.specs import ClampedSwiglu, MoeSpec


def parse_gpt_oss(fields: Fields, layers: int) -> dict[str, Any]:
    """The sinks, the biases and the MoE of a gpt-oss config (the windows are the caller's)."""
    try:
        spec = MoeSpec(
            num_experts=fields.integer("num_local_experts"),
            top_k=fields.integer("num_experts_per_tok"),
            intermediate_size=fields.integer("intermediate_size"),
            normalize=True,  # a softmax over the top k logits
            shared_intermediate_size=0,
            layers=tuple(range(layers)),
            naming="gpt_oss",
            router_bias=True,
            expert_bias=True,
            swiglu=ClampedSwiglu(
                fields.optional_number("swiglu_alpha", 1.702),
                fields.optional_number("swiglu_limit", 7.0),
            ),
            expert_format=_expert_format(fields),
        )
    except ValueError as exc:
        raise fields.error(str(exc)) from None
    return {"attention_sinks": True, "moe": spec}


def _expert_format(fields: Fields) -> str:
    """ "mxfp4" for a checkpoint whose experts are packed MXFP4, else "" (the model dtype)."""
    qc = fields.raw.get("quantization_config")
    if qc is None:
        return ""
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method != "mxfp4":
        raise fields.error(
            f"quantization_config.quant_method={method!r} is not supported for gpt-oss "
            "(supported: mxfp4)"
        )
    return "mxfp4"
