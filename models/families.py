"""Model families: which family a HF directory's config.json names.

A family is what the engine composes a model from (engine/model) and what decides the
defaults around it (the router's tool-call format follows the chat template instead:
router.api.tool_parsers). The engine refuses an option of a family it does not build by
name; this table only says which architectures are worth loading at all.
"""

from __future__ import annotations

from collections.abc import Mapping

# HF `architectures[0]` -> family
FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
# config.json `model_type` -> architecture, for exports that leave `architectures` empty
_ARCH_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}


def architecture_of(config: Mapping[str, object]) -> str:
    """The architecture a config.json names (`architectures[0]`, else by `model_type`).

    ValueError when it names none; the architecture may still be unsupported."""
    archs = config.get("architectures")
    if not archs:  # older exports leave it empty
        fallback = _ARCH_BY_MODEL_TYPE.get(str(config.get("model_type")))
        archs = [fallback] if fallback else None
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ValueError("config.json names no architecture")
    return archs[0]


def family_of(config: Mapping[str, object]) -> str:
    """The family of a config.json ("qwen3", "gemma2", ...); ValueError naming the
    architecture and the supported ones when it is not supported."""
    arch = architecture_of(config)
    family = FAMILIES.get(arch)
    if family is None:
        raise ValueError(
            f"architecture {arch!r} is not supported (supported: {', '.join(FAMILIES)})"
        )
    return family
