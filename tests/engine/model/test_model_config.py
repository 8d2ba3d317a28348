"""ModelConfig parses HF config.json files of both transformers generations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.model.config import ModelConfig
from engine.model.families import FAMILIES as FAMILY_PARSERS
from engine.model.rope import Rope
from models.architectures import ARCHITECTURES
from tests.engine.model.tiny_families import FAMILIES, WINDOW, save_family
from tests.engine.model.tiny_families import FAMILIES as TINY_FAMILIES

# transformers-5 style, as the default model's converted config.json
V5: dict[str, Any] = {
    "architectures": None,
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "eos_token_id": 2,
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "attention_bias": False,
    "mlp_bias": False,
    "head_dim": 64,
}
# older style: rope_theta at the top, llama3 scaling in rope_scaling, eos a list
LLAMA31: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "eos_token_id": [128001, 128008, 128009],
}


def write(path: Path, config: dict[str, Any], generation: dict[str, Any] | None = None) -> Path:
    (path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    return path


def test_transformers5_config(tmp_path: Path) -> None:
    cfg = ModelConfig.from_dir(write(tmp_path, V5))
    assert cfg.architecture == "LlamaForCausalLM"  # from model_type when architectures is null
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert cfg.head_dim == 64 and cfg.q_size == 576 and cfg.kv_size == 192
    assert cfg.rope == Rope(100000.0) and cfg.local_rope is None
    assert cfg.tie_word_embeddings and cfg.eos_token_ids == {2}
    assert cfg.name == tmp_path.name


def test_older_config_with_llama3_scaling(tmp_path: Path) -> None:
    cfg = ModelConfig.from_dir(write(tmp_path, LLAMA31, {"eos_token_id": [128009, 7]}))
    assert cfg.rope == Rope(500000.0, "llama3", 8.0, 8192, 1.0, 4.0)
    assert cfg.head_dim == 128  # hidden / heads when head_dim is absent
    assert cfg.eos_token_ids == {128001, 128008, 128009, 7}  # config and generation_config
    assert not cfg.tie_word_embeddings


def test_llama3_in_rope_parameters() -> None:
    params = dict(LLAMA31["rope_scaling"], rope_theta=500000.0)
    raw = {k: v for k, v in LLAMA31.items() if k not in ("rope_theta", "rope_scaling")}
    cfg = ModelConfig.from_dict(raw | {"rope_parameters": params})
    assert cfg.rope == Rope(500000.0, "llama3", 8.0, 8192, 1.0, 4.0)


def test_defaults_when_optional_fields_are_absent() -> None:
    raw = {k: v for k, v in LLAMA31.items() if k not in ("rope_theta", "rope_scaling")}
    raw.pop("num_key_value_heads")
    cfg = ModelConfig.from_dict(raw)
    assert cfg.rope == Rope(10000.0)
    assert cfg.num_key_value_heads == 32  # plain multi-head attention


def test_mistral_without_sliding_window_is_llama_math() -> None:
    raw = V5 | {"architectures": ["MistralForCausalLM"], "sliding_window": None}
    assert ModelConfig.from_dict(raw).architecture == "MistralForCausalLM"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel"),
        ({"architectures": None, "model_type": "gpt2"}, "'gpt2'"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "'gelu'"),
        ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "longrope"}}, "'longrope'"),
        ({"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}}, "partial_rotary"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "'factor'"),
        ({"hidden_size": None}, "'hidden_size' is missing"),
        ({"vocab_size": "big"}, "'vocab_size' must be an integer"),
        ({"num_key_value_heads": 4}, "num_key_value_heads"),
        ({"eos_token_id": "</s>"}, "eos_token_id"),
    ],
)
def test_unsupported_or_broken_config_names_file_and_value(
    tmp_path: Path, change: dict[str, Any], words: str
) -> None:
    write(tmp_path, V5 | change)
    with pytest.raises(ValueError, match=r"config\.json") as err:
        ModelConfig.from_dir(tmp_path)
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no config\.json"):
        ModelConfig.from_dir(tmp_path)


@pytest.fixture(scope="module")
def family_configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelConfig]:
    """Each tiny family as transformers saves it, read back."""
    out = {}
    for name in FAMILIES:
        path = tmp_path_factory.mktemp(name)
        save_family(name, path)
        out[name] = ModelConfig.from_dir(path)
    return out


def test_each_family_reads_its_options(family_configs: dict[str, ModelConfig]) -> None:
    c = family_configs
    assert (c["qwen2"].family, c["qwen2"].qkv_bias, c["qwen2"].o_bias) == ("qwen2", True, False)
    assert c["qwen2"].layer_windows == (0, 0)
    assert c["qwen2_window"].layer_windows == (0, WINDOW)  # from max_window_layers = 1
    assert c["qwen3"].qk_norm and c["qwen3"].head_dim == 32 and not c["qwen3"].qkv_bias
    assert c["mistral"].layer_windows == (WINDOW, WINDOW) and c["mistral"].sliding_window == WINDOW
    assert c["phi3"].naming == "phi3" and c["phi3"].sliding_window == WINDOW
    g2, g3 = c["gemma2"], c["gemma3"]
    assert (g2.norm_offset, g2.sandwich_norms, g2.activation) == (1.0, True, "gelu_tanh")
    assert g2.embed_scale == 64**0.5 and g2.attention_scale == 24**-0.5
    assert (g2.attn_softcap, g2.final_softcap) == (4.0, 3.0)
    assert g2.layer_windows == (WINDOW, 0) and g2.sliding_window == 0
    assert g3.qk_norm and g3.layer_windows == (WINDOW, 0, WINDOW)
    assert g3.rope == Rope(1e6, "linear", 4.0, 256) and g3.local_rope == Rope(1e4)
    assert c["llama_yarn"].rope.type == "yarn" and c["llama_yarn"].rope.factor == 8.0


def test_moe_families_read_their_experts(family_configs: dict[str, ModelConfig]) -> None:
    q3, q2, mx = (family_configs[n].moe for n in ("qwen3_moe", "qwen2_moe", "mixtral"))
    assert q3 is not None and q2 is not None and mx is not None
    assert (q3.num_experts, q3.top_k, q3.intermediate_size, q3.normalize) == (8, 2, 32, True)
    assert q3.layers == (0, 2) and q3.naming == "qwen_moe"  # layer 1 is mlp_only
    assert q2.shared_intermediate_size == 48 and not q2.normalize and q2.layers == (0, 1)
    assert (mx.num_experts, mx.normalize, mx.naming, mx.intermediate_size) == (
        4,
        True,
        "mixtral",
        96,
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, "bidirectional"),
        (
            {
                "model_type": "qwen2",
                "use_sliding_window": True,
                "layer_types": ["chunked_attention"] * 30,
            },
            "chunked_attention",
        ),
        (
            {"model_type": "qwen2", "use_sliding_window": True, "layer_types": ["full_attention"]},
            "'layer_types' must list 30",
        ),
        ({"model_type": "mistral", "sliding_window": 0}, "'sliding_window' must be >= 1"),
        ({"model_type": "qwen3_moe"}, "'num_local_experts' is missing"),
        ({"model_type": "gemma2", "hidden_activation": "relu"}, "hidden_activation='relu'"),
    ],
)
def test_family_options_not_built_are_refused_by_name(change: dict[str, Any], words: str) -> None:
    raw = {k: v for k, v in V5.items() if k != "architectures"} | change
    with pytest.raises(ValueError, match=r"config\.json") as err:
        ModelConfig.from_dict(raw | {"sliding_window": raw.get("sliding_window", 4)})
    assert words in str(err.value)


def test_every_architecture_the_cluster_accepts_has_a_family() -> None:
    """The router's and CLI's directory check and the engine read one table."""
    assert {family for family, _ in ARCHITECTURES.values()} == set(FAMILY_PARSERS)
    assert {c for c, _, _ in TINY_FAMILIES.values()} >= {"Qwen3MoeConfig", "Gemma3TextConfig"}
