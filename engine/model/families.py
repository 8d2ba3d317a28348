"""The model families the engine serves, and what each one's ``config.json`` means.

A family is a set of options over one decoder (``engine.model.decoder``): q/k/v biases,
per-head q/k norms, sliding windows per layer, soft-capping, Gemma's norms and embedding
scale, attention sinks, the MLP's activation, mixture-of-experts layers, and its
checkpoint's tensor names.
``family_values`` reads those options from a config; an option a family sets that the
engine does not build is refused by name before any weight is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.model.config_fields import Fields
from engine.model.deepseek import parse_deepseek
from engine.model.glm import parse_glm4_moe
from engine.model.gpt_oss import parse_gpt_oss
from engine.model.qwen3_next import parse_qwen3_next
from engine.model.rope import Rope, parse_rope
from engine.model.specs import MoeSpec
from models.architectures import ARCHITECTURES, SUPPORTED_ARCHITECTURES, declared_architecture

ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
LAYER_TYPES = ("full_attention", "sliding_attention")
PARTIAL_ROTARY = ("glm4_moe", "qwen3_next")  # families turning part of each head (rope_dims)


@dataclass(frozen=True)
class Family:
    name: str  # as models.architectures names it
    parse: Callable[[Fields, int], dict[str, Any]]  # (fields, layers) -> ModelConfig values


def _base(fields: Fields, layers: int) -> dict[str, Any]:
    """The Llama baseline every family starts from; refuses what no family builds."""
    raw = fields.raw
    if raw.get("mlp_bias"):
        raise fields.refuse("mlp_bias", "no family with MLP biases is built")
    key = "hidden_activation" if fields.has("hidden_activation") else "hidden_act"
    act = raw.get(key, "silu")
    if act not in ACTIVATIONS:
        raise fields.refuse(key, f"supported: {', '.join(ACTIVATIONS)}")
    bias = bool(raw.get("attention_bias", False))
    return {
        "activation": ACTIVATIONS[act],
        "qkv_bias": bias,
        "o_bias": bias,
        "layer_windows": (0,) * layers,
    }


def _window(fields: Fields) -> int:
    window = fields.integer("sliding_window")
    if window < 1:
        raise fields.error(f"'sliding_window' must be >= 1, got {window}")
    return window


def _windows_from_types(fields: Fields, layers: int) -> tuple[int, ...] | None:
    """Per-layer windows from ``layer_types`` (transformers 5 writes it), or None."""
    types = fields.raw.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != layers:
        raise fields.error(f"'layer_types' must list {layers} layers, got {types!r}")
    for kind in types:
        if kind not in LAYER_TYPES:
            raise fields.error(
                f"layer_types has {kind!r}, not supported (supported: {', '.join(LAYER_TYPES)})"
            )
    if "sliding_attention" not in types:
        return (0,) * layers
    window = _window(fields)
    return tuple(window if kind == "sliding_attention" else 0 for kind in types)


def _all_windowed(fields: Fields, layers: int) -> dict[str, Any]:
    """Mistral, Mixtral, Phi-3: one ``sliding_window`` over every layer, when set."""
    window = _window(fields) if fields.has("sliding_window") else 0
    return {"layer_windows": (window,) * layers}


def _qwen_windows(fields: Fields, layers: int, rule: Callable[[int], bool]) -> dict[str, Any]:
    """Qwen's ``use_sliding_window``: the layers ``rule`` picks, unless ``layer_types`` says."""
    if not fields.raw.get("use_sliding_window"):
        return {"layer_windows": (0,) * layers}
    windows = _windows_from_types(fields, layers)
    if windows is None:
        window = _window(fields)
        windows = tuple(window if rule(i) else 0 for i in range(layers))
    return {"layer_windows": windows}


def _qwen_moe(fields: Fields, layers: int, experts_key: str, shared: bool) -> dict[str, Any]:
    step = fields.optional_integer("decoder_sparse_step", 1)
    dense = set(fields.raw.get("mlp_only_layers") or [])
    experts = fields.integer(experts_key)
    sparse = tuple(i for i in range(layers) if i not in dense and experts and (i + 1) % step == 0)
    spec = MoeSpec(
        num_experts=experts,
        top_k=fields.integer("num_experts_per_tok"),
        intermediate_size=fields.integer("moe_intermediate_size"),
        normalize=bool(fields.raw.get("norm_topk_prob", False)),
        shared_intermediate_size=(
            fields.integer("shared_expert_intermediate_size") if shared else 0
        ),
        layers=sparse,
        naming="qwen_moe",
    )
    return {"moe": spec}


def _llama(fields: Fields, layers: int) -> dict[str, Any]:
    return _base(fields, layers)


def _mistral(fields: Fields, layers: int) -> dict[str, Any]:
    return _base(fields, layers) | _all_windowed(fields, layers)


def _mixtral(fields: Fields, layers: int) -> dict[str, Any]:
    spec = MoeSpec(
        num_experts=fields.integer("num_local_experts"),
        top_k=fields.integer("num_experts_per_tok"),
        intermediate_size=fields.integer("intermediate_size"),
        normalize=True,
        shared_intermediate_size=0,
        layers=tuple(range(layers)),
        naming="mixtral",
    )
    return _mistral(fields, layers) | {"moe": spec}


def _qwen2(fields: Fields, layers: int) -> dict[str, Any]:
    max_window = fields.optional_integer("max_window_layers", layers)
    values = _base(fields, layers) | {"qkv_bias": True, "o_bias": False}
    return values | _qwen_windows(fields, layers, lambda i: i >= max_window)


def _qwen2_moe(fields: Fields, layers: int) -> dict[str, Any]:
    max_window = fields.optional_integer("max_window_layers", layers)
    bias = bool(fields.raw.get("qkv_bias", True))
    values = _base(fields, layers) | {"qkv_bias": bias, "o_bias": False}
    values |= _qwen_windows(fields, layers, lambda i: (i + 1) % 2 == 1 and i < max_window)
    return values | _qwen_moe(fields, layers, "num_experts", shared=True)


def _qwen3(fields: Fields, layers: int) -> dict[str, Any]:
    max_window = fields.optional_integer("max_window_layers", layers)
    values = _base(fields, layers) | {"qk_norm": True}
    return values | _qwen_windows(fields, layers, lambda i: i >= max_window)


def _qwen3_moe(fields: Fields, layers: int) -> dict[str, Any]:
    values = _base(fields, layers) | {"qk_norm": True}
    values |= _qwen_windows(fields, layers, lambda i: True)
    experts_key = "num_experts" if fields.has("num_experts") else "num_local_experts"
    return values | _qwen_moe(fields, layers, experts_key, shared=False)


def _qwen3_next(fields: Fields, layers: int) -> dict[str, Any]:
    """Qwen3-Next: (1 + w) norms, q/k norms, linear and gated full attention, MoE with a
    gated shared expert."""
    values = _base(fields, layers) | {"qk_norm": True, "norm_offset": 1.0}
    values |= parse_qwen3_next(fields, layers, _head_dim(fields))
    return values | _qwen_moe(fields, layers, "num_experts", shared=True)


def _phi3(fields: Fields, layers: int) -> dict[str, Any]:
    return _base(fields, layers) | _all_windowed(fields, layers) | {"naming": "phi3"}


def _gemma(fields: Fields, layers: int, pattern: int) -> dict[str, Any]:
    """Gemma 2 and 3: (1 + w) norms, sandwich norms, scaled embedding, local and global
    layers; ``pattern``: every pattern-th layer is global when ``layer_types`` is absent."""
    hidden, head_dim = fields.integer("hidden_size"), _head_dim(fields)
    windows = _windows_from_types(fields, layers)
    if windows is None:
        window = _window(fields)
        every = fields.optional_integer("sliding_window_pattern", pattern)
        windows = tuple(window if (i + 1) % every else 0 for i in range(layers))
    if fields.raw.get("use_bidirectional_attention"):
        raise fields.refuse("use_bidirectional_attention", "causal decoding only")
    return _base(fields, layers) | {
        "norm_offset": 1.0,
        "sandwich_norms": True,
        "embed_scale": math.sqrt(hidden),
        "attention_scale": fields.optional_number("query_pre_attn_scalar", head_dim) ** -0.5,
        "attn_softcap": fields.optional_number("attn_logit_softcapping", 0.0),
        "final_softcap": fields.optional_number("final_logit_softcapping", 0.0),
        "layer_windows": windows,
    }


def _gemma2(fields: Fields, layers: int) -> dict[str, Any]:
    return _gemma(fields, layers, pattern=2)


def _gemma3(fields: Fields, layers: int) -> dict[str, Any]:
    return _gemma(fields, layers, pattern=6) | {"qk_norm": True}


def _deepseek_v2(fields: Fields, layers: int) -> dict[str, Any]:
    return _base(fields, layers) | parse_deepseek(fields, layers, v3=False)


def _deepseek_v3(fields: Fields, layers: int) -> dict[str, Any]:
    return _base(fields, layers) | parse_deepseek(fields, layers, v3=True)


def _gpt_oss(fields: Fields, layers: int) -> dict[str, Any]:
    windows = _windows_from_types(fields, layers)
    if windows is None:  # gpt-oss alternates, sliding first
        window = _window(fields)
        windows = tuple(0 if i % 2 else window for i in range(layers))
    return _base(fields, layers) | parse_gpt_oss(fields, layers) | {"layer_windows": windows}


def _glm4_moe(fields: Fields, layers: int) -> dict[str, Any]:
    return _base(fields, layers) | parse_glm4_moe(fields, layers, _head_dim(fields))


def _smollm3(fields: Fields, layers: int) -> dict[str, Any]:
    """SmolLM3: NoPE layers (``no_rope_layers[i]`` 0; absent, every
    ``no_rope_layer_interval``-th layer), windowed where ``layer_types`` says, else the NoPE
    layers when ``use_sliding_window``."""
    uses_rope = fields.raw.get("no_rope_layers")
    if uses_rope is None:
        every = fields.optional_integer("no_rope_layer_interval", 4)
        if every < 1:
            raise fields.error(f"'no_rope_layer_interval' must be >= 1, got {every}")
        uses_rope = [int((i + 1) % every != 0) for i in range(layers)]
    if not isinstance(uses_rope, list) or len(uses_rope) != layers or set(uses_rope) - {0, 1}:
        raise fields.error(f"'no_rope_layers' must list 0 or 1 for {layers} layers")
    nope = tuple(i for i, rope in enumerate(uses_rope) if not rope)
    windows = _qwen_windows(fields, layers, lambda i: i in nope)
    if not fields.has("sliding_window"):  # transformers then makes every layer full
        windows = {"layer_windows": (0,) * layers}
    return _base(fields, layers) | windows | {"nope_layers": nope}


def _head_dim(fields: Fields) -> int:
    if fields.has("head_dim"):
        return fields.integer("head_dim")
    return fields.integer("hidden_size") // fields.integer("num_attention_heads")


FAMILIES = {
    f.name: f
    for f in (
        Family("llama", _llama),
        Family("mistral", _mistral),
        Family("mixtral", _mixtral),
        Family("qwen2", _qwen2),
        Family("qwen2_moe", _qwen2_moe),
        Family("qwen3", _qwen3),
        Family("qwen3_moe", _qwen3_moe),
        Family("qwen3_next", _qwen3_next),
        Family("phi3", _phi3),
        Family("gemma2", _gemma2),
        Family("gemma3", _gemma3),
        Family("deepseek_v2", _deepseek_v2),
        Family("deepseek_v3", _deepseek_v3),
        Family("gpt_oss", _gpt_oss),
        Family("glm4_moe", _glm4_moe),
        Family("smollm3", _smollm3),
    )
}


def find_family(fields: Fields) -> tuple[Family, str]:
    """The family and architecture name a config declares (``architectures``, else
    ``model_type``); an unknown one is refused with the supported list."""
    arch, said = declared_architecture(fields.raw)
    if arch is None:
        how = "" if fields.raw.get("architectures") else " (no 'architectures' given)"
        raise fields.error(
            f"{said} is not supported{how}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return FAMILIES[ARCHITECTURES[arch][0]], arch


def parse_ropes(fields: Fields, family: Family) -> tuple[Rope, Rope | None]:
    """(global rope, the local layers' rope or None when they share the global one)."""
    raw, max_pos = fields.raw, fields.integer("max_position_embeddings")
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:  # per layer type (v5 Gemma 3)
        full, local = params["full_attention"], params.get("sliding_attention")
        rope = _rope(fields, full, max_pos)
        return rope, None if local is None else _rope(fields, local, max_pos)
    if params:
        rope = _rope(fields, params, max_pos)
    else:
        theta = fields.number("rope_theta") if fields.has("rope_theta") else 10000.0
        rope = parse_rope(raw.get("rope_scaling") or {}, theta, max_pos, fields.source)
    partial = (params or {}).get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1.0 and family.name not in PARTIAL_ROTARY:
        raise fields.error(
            f"partial_rotary_factor={partial!r} is not supported (rotary over the whole head)"
        )
    if family.name == "gemma3" and fields.has("rope_local_base_freq"):  # older Gemma 3
        return rope, Rope(theta=fields.number("rope_local_base_freq"))
    if family.name == "gemma3":
        return rope, Rope(theta=10000.0)
    return rope, None


def _rope(fields: Fields, params: dict[str, Any], max_pos: int) -> Rope:
    theta = fields.number("rope_theta", params)
    return parse_rope(params, theta, max_pos, fields.source)
