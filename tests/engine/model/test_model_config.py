"""ModelConfig parses HF config.json files of both transformers generations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.model.config import ModelConfig, RopeScaling

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
    assert cfg.rope_theta == 100000.0 and cfg.rope_scaling is None
    assert cfg.tie_word_embeddings and cfg.eos_token_ids == {2}
    assert cfg.name == tmp_path.name


def test_older_config_with_llama3_scaling(tmp_path: Path) -> None:
    cfg = ModelConfig.from_dir(write(tmp_path, LLAMA31, {"eos_token_id": [128009, 7]}))
    assert cfg.rope_theta == 500000.0
    assert cfg.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    assert cfg.head_dim == 128  # hidden / heads when head_dim is absent
    assert cfg.eos_token_ids == {128001, 128008, 128009, 7}  # config and generation_config
    assert not cfg.tie_word_embeddings


def test_llama3_in_rope_parameters() -> None:
    params = dict(LLAMA31["rope_scaling"], rope_theta=500000.0)
    raw = {k: v for k, v in LLAMA31.items() if k not in ("rope_theta", "rope_scaling")}
    cfg = ModelConfig.from_dict(raw | {"rope_parameters": params})
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)


def test_defaults_when_optional_fields_are_absent() -> None:
    raw = {k: v for k, v in LLAMA31.items() if k not in ("rope_theta", "rope_scaling")}
    raw.pop("num_key_value_heads")
    cfg = ModelConfig.from_dict(raw)
    assert cfg.rope_theta == 10000.0 and cfg.rope_scaling is None
    assert cfg.num_key_value_heads == 32  # plain multi-head attention


def test_mistral_without_sliding_window_is_llama_math() -> None:
    raw = V5 | {"architectures": ["MistralForCausalLM"], "sliding_window": None}
    assert ModelConfig.from_dict(raw).architecture == "MistralForCausalLM"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"architectures": ["Qwen2ForCausalLM"]}, "Qwen2ForCausalLM"),
        ({"architectures": None, "model_type": "gpt2"}, "'gpt2'"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "'gelu'"),
        ({"sliding_window": 4096}, "sliding_window"),
        ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn"}}, "'yarn'"),
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
