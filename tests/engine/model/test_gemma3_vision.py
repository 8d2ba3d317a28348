"""``Gemma3ForConditionalGeneration``'s text model: its nested ``text_config`` read with
Gemma 3's defaults, the vision tower's tensors left unread, and greedy tokens equal to
transformers' image-text model given token ids only (C, torch and Triton paths)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.model.config import ModelConfig
from engine.model.rope import Rope
from tests.engine.model.test_families import NEW_TOKENS, PATHS, PROMPTS, engine_greedy
from tests.engine.model.test_mla import check_prefix_hit
from tests.engine.model.tiny_families import hf_greedy, save_gemma3_vision

# google/gemma-3-4b-it's text_config: only what differs from Gemma3TextConfig's defaults
GEMMA3_4B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "eos_token_id": [1, 106],
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {"model_type": "siglip_vision_model"},
}


@pytest.fixture(scope="module")
def gemma3_vision(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    path = tmp_path_factory.mktemp("gemma3_vision")
    return save_gemma3_vision(path), path


@pytest.mark.parametrize("path_name", list(PATHS))
def test_greedy_equals_transformers(gemma3_vision: tuple[Any, Path], path_name: str) -> None:
    if path_name == "triton":
        pytest.importorskip("triton")
    hf, path = gemma3_vision
    prompts = PROMPTS if path_name != "triton" else PROMPTS[:2]
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]
    assert engine_greedy(path, prompts, **PATHS[path_name]) == expected


def test_a_prefix_cache_hit_keeps_transformers_tokens(gemma3_vision: tuple[Any, Path]) -> None:
    check_prefix_hit(*gemma3_vision)


def test_the_text_config_takes_gemma3_defaults() -> None:
    cfg = ModelConfig.from_dict(GEMMA3_4B, source="gemma-3-4b-it/config.json")
    assert (cfg.family, cfg.architecture) == ("gemma3", "Gemma3ForConditionalGeneration")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (2560, 34, 262_208)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (8, 4, 256)
    assert cfg.activation == "gelu_tanh" and cfg.tie_word_embeddings and cfg.qk_norm
    assert cfg.attention_scale == 256**-0.5 and cfg.eos_token_ids == {1, 106}
    assert cfg.rope == Rope(1e6, "linear", 8.0, 131_072) and cfg.local_rope == Rope(1e4)
    windows = tuple(0 if (i + 1) % 6 == 0 else 1024 for i in range(34))
    assert cfg.layer_windows == windows


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"text_config": None}, "text_config"),
        (
            {"text_config": GEMMA3_4B["text_config"] | {"use_bidirectional_attention": True}},
            r"\(text_config\): use_bidirectional_attention=True",
        ),
        (
            {"text_config": GEMMA3_4B["text_config"] | {"head_dim": "x"}},
            r"\(text_config\): 'head_dim' must be an integer",
        ),
    ],
)
def test_a_bad_text_config_is_refused_by_name(change: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ModelConfig.from_dict(GEMMA3_4B | change, source="config.json")
