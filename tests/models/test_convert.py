"""The converted default model: a plain HF directory with the right tensors that answers well.

Uses the session fixture `default_model_dir` (pulled once through models).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from models import validate_model_dir

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 576, 9, 3, 64
LAYERS, VOCAB, INTERMEDIATE = 30, 49152, 1536


def _expected_shapes() -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.input_layernorm.weight": (HIDDEN,),
            f"{p}.post_attention_layernorm.weight": (HIDDEN,),
            f"{p}.self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            f"{p}.self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            f"{p}.self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            f"{p}.self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            f"{p}.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
            f"{p}.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            f"{p}.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
        }
    return shapes


@pytest.mark.model
def test_config_is_plain_llama(default_model_dir: Path) -> None:
    validate_model_dir(default_model_dir)
    config = json.loads((default_model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"]) == (LAYERS, HIDDEN)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (HEADS, KV_HEADS)
    assert (config["vocab_size"], config["tie_word_embeddings"]) == (VOCAB, True)


@pytest.mark.model
def test_safetensors_hold_fp32_weights_with_expected_shapes(default_model_dir: Path) -> None:
    with safe_open(str(default_model_dir / "model.safetensors"), framework="pt") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
        embed = f.get_tensor("model.embed_tokens.weight")
    assert shapes == _expected_shapes()  # tied: no lm_head.weight
    assert embed.dtype == torch.float32
    assert torch.isfinite(embed).all()


@pytest.mark.model
def test_tokenizer_files_written(default_model_dir: Path) -> None:
    assert (default_model_dir / "tokenizer.json").is_file()
    assert (default_model_dir / "generation_config.json").is_file()


@pytest.mark.model
def test_transformers_answers_paris(default_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer: Any = AutoTokenizer.from_pretrained(default_model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs: Any = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    prompt_len = inputs["input_ids"].shape[1]
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, prompt_len:], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_convert_refuses_missing_gguf(tmp_path: Path) -> None:
    from models.convert import convert_gguf

    with pytest.raises(ValueError, match=r"missing\.gguf not found"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
