"""Tiny random-weight models of every family, built with transformers' own classes.

Weights are scaled so that every layer, norm and expert moves the tokens (matrices
~ N(0, 1 / fan_in), norms around their trained value); windows are shorter than the prompts
and not multiples of the block size; soft-caps low enough to bite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

BASE: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
WINDOW = 7
# family -> (transformers config class, model class, config overrides)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen2_window": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    ),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "num_hidden_layers": 3,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
        },
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {
            "num_experts": 6,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
        },
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW},
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": WINDOW}),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {"sliding_window": WINDOW, "head_dim": None, "pad_token_id": 0},
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 4.0,
            "final_logit_softcapping": 3.0,
            "tie_word_embeddings": True,
        },
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "num_hidden_layers": 3,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "query_pre_attn_scalar": 24,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        },
    ),
    "llama_yarn": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 1e4,
                "factor": 8.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    "llama_linear": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
    ),
    "llama_dynamic": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}},
    ),
}
MLA_SHAPE: dict[str, Any] = {
    "num_key_value_heads": 4,  # transformers repeats the expanded K/V heads by it
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "head_dim": 8,  # transformers rotates head_dim dimensions: the rotary part
    "v_head_dim": 12,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
}
FAMILIES |= {
    # MLA without q-LoRA, V2's softmax routing limited to the best group of two
    "deepseek_v2": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        MLA_SHAPE | {
            "q_lora_rank": None, "n_routed_experts": 4, "topk_method": "group_limited_greedy",
            "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.0,
        },
    ),
    # MLA with q-LoRA, a dense first layer, sigmoid routing over 2 of 4 groups with the
    # correction bias, YaRN with DeepSeek's mscale on the scores
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        MLA_SHAPE | {
            "num_hidden_layers": 3, "q_lora_rank": 24, "n_routed_experts": 8, "n_group": 4,
            "topk_group": 2, "first_k_dense_replace": 1, "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "rope_parameters": {
                "rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 1.0,
            },
        },
    ),
}  # fmt: skip
# gpt-oss: sinks, biases, sliding / full layers with a window under the prompts, YaRN
# without truncation, a clamp low enough to bite (shapes multiples of 32 for MXFP4)
FAMILIES["gpt_oss"] = (
    "GptOssConfig",
    "GptOssForCausalLM",
    {
        "num_hidden_layers": 4, "sliding_window": WINDOW, "num_local_experts": 4,
        "num_experts_per_tok": 2, "intermediate_size": 32, "swiglu_limit": 1.5,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "original_max_position_embeddings": 64, "truncate": False,
        },
    },
)  # fmt: skip
# GLM-4.5 MoE: a rotary over half of each head, q/k norms, q/k/v biases, a dense first
# layer, sigmoid routing over 2 of 4 groups with the correction bias and a shared expert
FAMILIES["glm4_moe"] = (
    "Glm4MoeConfig",
    "Glm4MoeForCausalLM",
    {
        "num_hidden_layers": 3, "head_dim": 32, "partial_rotary_factor": 0.5,
        "use_qk_norm": True, "attention_bias": True, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
        "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5, "norm_topk_prob": True,
    },
)  # fmt: skip
# SmolLM3: every other layer without rotary, the NoPE layers windowed
FAMILIES["smollm3"] = (
    "SmolLM3Config",
    "SmolLM3ForCausalLM",
    {
        "num_hidden_layers": 4, "no_rope_layer_interval": 2, "use_sliding_window": True,
        "sliding_window": WINDOW,
    },
)  # fmt: skip
# Qwen3-Next: linear (Gated DeltaNet) and gated full attention layers, MoE with a gated
# shared expert on all but a dense layer, a rotary over half of each head
FAMILIES["qwen3_next"] = (
    "Qwen3NextConfig",
    "Qwen3NextForCausalLM",
    {
        "num_hidden_layers": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 16, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48, "mlp_only_layers": [2],
        "layer_types": ["linear_attention", "full_attention"] * 2,
        "rope_parameters": {
            "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5,
        },
    },
)  # fmt: skip
MLA = ["deepseek_v2", "deepseek_v3"]
HYBRID = ["qwen3_next"]
DENSE = [
    f
    for f in FAMILIES
    if "moe" not in f and f not in ("mixtral", "gpt_oss") and f not in MLA + HYBRID
]
MOE = ["qwen3_moe", "qwen2_moe", "mixtral", "glm4_moe"]


def save_family(name: str, path: Path, seed: int = 0, **changes: Any) -> Any:
    """Save the tiny ``name`` model (with ``changes`` to its config) as a HF directory in
    ``path``; return it (eval, fp32)."""
    config_cls, model_cls, overrides = FAMILIES[name]
    values = {k: v for k, v in (BASE | overrides | changes).items() if v is not None}
    config = getattr(transformers, config_cls)(**values)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    _scale_weights(model, gemma=name.startswith("gemma"))
    model.save_pretrained(path)
    return model


def save_gemma3_vision(path: Path, seed: int = 0) -> Any:
    """A tiny ``Gemma3ForConditionalGeneration`` (the tiny Gemma 3 text model, a one-layer
    vision tower) saved as a HF directory in ``path``; return it (eval, fp32)."""
    _, _, overrides = FAMILIES["gemma3"]
    text = {k: v for k, v in (BASE | overrides).items() if v is not None}
    vision = {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
    }  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4
    )
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    _scale_weights(model, gemma=True)
    model.save_pretrained(path)
    return model


def _scale_weights(model: Any, gemma: bool) -> None:
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1 and "norm" in pname:  # Gemma stores w of (1 + w)
                p.copy_((0.0 if gemma else 1.0) + 0.2 * torch.randn_like(p))
            elif p.dim() == 1:  # biases
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):  # DeepSeek-V3's, GLM's
                b.copy_(0.1 * torch.randn_like(b))


def hf_greedy_gaps(model: Any, prompt: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    """``hf_greedy``'s tokens and, per token, the gap between transformers' top two logits."""
    ids, gaps = list(prompt), []
    with torch.inference_mode():
        for _ in range(new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 2).values
            gaps.append(float(top[0] - top[1]))
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :], gaps


def assert_greedy_near(got: list[int], want: list[int], gaps: list[float], tie: float) -> None:
    """``got`` equals transformers' ``want`` up to its end, or up to a token where the two
    best logits were under ``tie`` apart (summation order may pick either; the tokens after
    it continue another text)."""
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            assert gaps[i] < tie, f"token {i}: {a} != {b} at a top-2 gap of {gaps[i]:.4f}"
            return


def hf_greedy(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy continuation with transformers' model, recomputing the whole sequence each
    token (no cache: the oracle is the plain forward)."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]
