"""The architectures the engine serves, by the names Hugging Face configs give them.

One table for the router's and the CLI's model-directory checks (torch-free) and the
engine's families (``engine.model.families`` parses each one's options).
"""

from __future__ import annotations

from typing import Any

# architecture -> (engine family, the config's model_type)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "llama"),
    "MistralForCausalLM": ("mistral", "mistral"),
    "MixtralForCausalLM": ("mixtral", "mixtral"),
    "Qwen2ForCausalLM": ("qwen2", "qwen2"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "qwen2_moe"),
    "Qwen3ForCausalLM": ("qwen3", "qwen3"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "qwen3_moe"),
    "Qwen3NextForCausalLM": ("qwen3_next", "qwen3_next"),
    "Phi3ForCausalLM": ("phi3", "phi3"),
    "Gemma2ForCausalLM": ("gemma2", "gemma2"),
    "Gemma3ForCausalLM": ("gemma3", "gemma3_text"),
    "Gemma3ForConditionalGeneration": ("gemma3", "gemma3"),  # its text model
    "DeepseekV2ForCausalLM": ("deepseek_v2", "deepseek_v2"),
    "DeepseekV3ForCausalLM": ("deepseek_v3", "deepseek_v3"),
    "GptOssForCausalLM": ("gpt_oss", "gpt_oss"),
    "Glm4MoeForCausalLM": ("glm4_moe", "glm4_moe"),
    "SmolLM3ForCausalLM": ("smollm3", "smollm3"),
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)
MODEL_TYPES = {model_type: arch for arch, (_, model_type) in ARCHITECTURES.items()}


def declared_architecture(config: dict[str, Any]) -> tuple[str | None, str]:
    """(the supported architecture a config declares, or None; what it declared, in words):
    from ``architectures``, else from ``model_type`` (older exports leave the former empty)."""
    archs = config.get("architectures")
    if archs:
        single = isinstance(archs, list) and len(archs) == 1
        said = f"architecture {archs[0]!r}" if single else f"architectures={archs!r}"
        return (archs[0] if single and archs[0] in ARCHITECTURES else None), said
    model_type = config.get("model_type")
    return MODEL_TYPES.get(str(model_type)), f"model_type {model_type!r}"


def family_of(config: dict[str, Any]) -> str:
    """The engine family of a config.json ("qwen3", "gemma2", ...); ValueError naming what
    it declared and the supported architectures when none is supported."""
    arch, said = declared_architecture(config)
    if arch is None and not config.get("architectures") and not config.get("model_type"):
        raise ValueError("config.json names no architecture")
    if arch is None:
        raise ValueError(f"{said} is not supported (supported: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[arch][0]
