"""Model directories of published shapes without their weights, for benchmarks.

A directory holds a config.json of the shape and the default model's tokenizer files; the
engine makes seeded random weights for it (``EngineConfig(load_format="random")``), on the
device, so a GPU machine benchmarks an 8B shape without downloading 16 GB.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

_BASE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}

# what every gpt-oss shares (gpt-oss-20b's and 120b's published config.json)
_GPT_OSS: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "head_dim": 64,
    "max_position_embeddings": 131072, "tie_word_embeddings": False, "attention_bias": True,
    "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128,
    "swiglu_limit": 7.0, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
        "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False,
    },
}  # fmt: skip

# DeepSeek-V3 (671B, 37B active): 256 experts, 8 active per token
_DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "rope_theta": 10000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
}


SHAPES: dict[str, dict[str, Any]] = {
    # SmolLM2-135M
    "smollm2": {
        "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "max_position_embeddings": 8192, "tie_word_embeddings": True,
        "rope_theta": 100000.0,
    },
    # Llama-3.2-1B
    "llama-1b": {
        "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 64, "max_position_embeddings": 131072, "tie_word_embeddings": True,
        "rope_theta": 500000.0,
        "rope_scaling": _LLAMA3_ROPE | {"factor": 32.0, "original_max_position_embeddings": 8192},
    },
    # Llama-3.1-8B
    "llama-8b": {
        "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 131072, "tie_word_embeddings": False,
        "rope_theta": 500000.0,
        "rope_scaling": _LLAMA3_ROPE | {"factor": 8.0, "original_max_position_embeddings": 8192},
    },
    # Qwen3-8B
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 40960, "tie_word_embeddings": False,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
    },
    # Qwen3-30B-A3B: 128 experts, 8 active per token
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "max_position_embeddings": 40960, "tie_word_embeddings": False,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "num_experts": 128,
        "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [],
    },
    # Qwen3-30B-A3B's routing (8 of many experts, Qwen3 attention) scaled to fit a small
    # CPU machine: 48 experts of 256 per layer, 8 layers, the default model's vocabulary
    "qwen3-moe-cpu": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": 49152, "hidden_size": 768, "intermediate_size": 2048,
        "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 4,
        "head_dim": 64, "max_position_embeddings": 8192, "tie_word_embeddings": True,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "num_experts": 48,
        "num_experts_per_tok": 8, "moe_intermediate_size": 256, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [],
    },
    "deepseek-v3": _DEEPSEEK_V3,
    # DeepSeek-V3 scaled to a small CPU machine: its latent attention as published (128 + 64
    # query dims, a 512 + 64 latent, 128 value dims, q-LoRA) over 16 heads, its routing (8 of
    # 64 experts in 8 groups, the best 4 groups, sigmoid scores with the correction bias, one
    # shared expert, a dense first layer), 6 layers, the default model's vocabulary
    "deepseek-v3-cpu": {
        **_DEEPSEEK_V3, "vocab_size": 49152, "hidden_size": 1024, "intermediate_size": 2816,
        "num_hidden_layers": 6, "num_attention_heads": 16, "num_key_value_heads": 16,
        "max_position_embeddings": 16384, "q_lora_rank": 384, "n_routed_experts": 64,
        "moe_intermediate_size": 256, "first_k_dense_replace": 1,
        "rope_scaling": {**_DEEPSEEK_V3["rope_scaling"], "factor": 4.0},
    },
    # gpt-oss-20b (21B, 3.6B active): 32 experts, 4 active per token, sliding (128) and
    # full layers alternating, attention sinks
    "gpt-oss-20b": _GPT_OSS | {
        "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
        "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
    },
    # gpt-oss-20b scaled to a small CPU machine: its attention (64-wide heads, 8 per KV head,
    # sinks, a 128-token window on every other layer), routing (4 of 32 experts) and
    # activation, 640 wide, 6 layers, the default model's vocabulary
    "gpt-oss-cpu": _GPT_OSS | {
        "vocab_size": 49152, "hidden_size": 640, "intermediate_size": 640,
        "num_hidden_layers": 6, "num_attention_heads": 16, "num_key_value_heads": 2,
        "layer_types": ["sliding_attention", "full_attention"] * 3,
    },
    # Qwen3-Next scaled to a small CPU machine: its Gated DeltaNet layers (two value heads per
    # key head, a conv of 4) with a full-attention layer every fourth, 8 of 64 experts plus
    # the gated shared expert, 512 wide, 8 layers, the default model's vocabulary
    "qwen3-next-cpu": {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "vocab_size": 49152, "hidden_size": 512, "intermediate_size": 1024,
        "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 64, "max_position_embeddings": 8192, "tie_word_embeddings": False,
        "rms_norm_eps": 1e-6, "linear_num_key_heads": 4, "linear_num_value_heads": 8,
        "linear_key_head_dim": 64, "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4,
        "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 256, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "norm_topk_prob": True, "full_attention_interval": 4,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
        "rope_parameters": {
            "rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
        },
    },
    # the step-overhead benchmark's model: the arithmetic of a step is next to nothing
    "tiny": {
        "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "max_position_embeddings": 4096, "tie_word_embeddings": True,
        "rope_theta": 10000.0,
    },
}  # fmt: skip

# the same layer kinds, small enough for the bench's own test
SHAPES["qwen3-next-tiny"] = SHAPES["qwen3-next-cpu"] | {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32, "full_attention_interval": 2,
    "layer_types": ["linear_attention", "full_attention"],
}  # fmt: skip
# the same with its experts packed MXFP4, as gpt-oss ships them
SHAPES["gpt-oss-cpu-mxfp4"] = SHAPES["gpt-oss-cpu"] | {
    "quantization_config": {"quant_method": "mxfp4"}
}

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def write_random_model_dir(
    name: str, path: Path, tokenizer_dir: Path | None = None, **overrides: Any
) -> Path:
    """Write ``path/config.json`` for shape ``name`` (and copy the tokenizer files found in
    ``tokenizer_dir``); load it with ``load_format="random"``."""
    if name not in SHAPES:
        raise ValueError(f"unknown random model {name!r}; one of {', '.join(SHAPES)}")
    path.mkdir(parents=True, exist_ok=True)
    config = _BASE | SHAPES[name] | overrides
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for file in _TOKENIZER_FILES:
        if tokenizer_dir is not None and (tokenizer_dir / file).is_file():
            shutil.copy(tokenizer_dir / file, path / file)
    return path
