"""gpt-oss (attention sinks, sliding and full layers, MoE with biases and the clamped
SwiGLU, YaRN) against transformers' own class on a tiny random-weight model: greedy tokens
on the C, torch and Triton paths (prompts longer than the window and over several blocks,
prefilled in chunks), a prefix-cache hit, and its options refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.model.config import ModelConfig
from tests.engine.model.test_families import PATHS, PROMPTS, greedy_tokens
from tests.engine.model.test_mla import check, check_prefix_hit, engine_of
from tests.engine.model.tiny_families import WINDOW, save_family


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    path = tmp_path_factory.mktemp("gpt_oss")
    return save_family("gpt_oss", path), path


def test_the_config_reads_sinks_windows_and_the_experts(gpt_oss: tuple[Any, Path]) -> None:
    config = ModelConfig.from_dir(gpt_oss[1])
    assert config.attention_sinks and config.qkv_bias and config.o_bias
    assert config.layer_windows == (WINDOW, 0, WINDOW, 0)
    assert config.moe is not None and config.moe.layers == (0, 1, 2, 3)
    assert config.moe.router_bias and config.moe.expert_bias
    assert config.moe.swiglu is not None and config.moe.swiglu.limit == 1.5
    assert config.rope.type == "yarn" and not config.rope.truncate


@pytest.mark.parametrize("path_name", list(PATHS))
def test_greedy_equals_transformers(gpt_oss: tuple[Any, Path], path_name: str) -> None:
    if path_name == "triton":
        pytest.importorskip("triton")
    hf, path = gpt_oss
    prompts = PROMPTS if path_name != "triton" else PROMPTS[:2]
    engine = engine_of(path, **PATHS[path_name])
    check(hf, prompts, greedy_tokens(engine, prompts))
    assert engine.stats().free_blocks == engine.stats().total_blocks


def test_a_prefix_cache_hit_keeps_transformers_tokens(gpt_oss: tuple[Any, Path]) -> None:
    """The second prompt shares 4 full blocks with the first: only its tail is computed,
    over cached keys of sliding and full layers, and the tokens are still transformers'."""
    check_prefix_hit(*gpt_oss)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"quantization_config": {"quant_method": "fp8"}}, "quant_method='fp8'"),
        ({"layer_types": ["chunked_attention", "full_attention"] * 2}, "chunked_attention"),
        ({"swiglu_limit": 0.0}, "swiglu_limit must be > 0"),
        ({"hidden_act": "relu"}, "hidden_act='relu'"),
    ],
)
def test_an_option_not_built_is_refused_by_name(
    gpt_oss: tuple[Any, Path], change: dict[str, Any], named: str
) -> None:
    hf, _ = gpt_oss
    raw = hf.config.to_dict() | change
    with pytest.raises(ValueError, match=named):
        ModelConfig.from_dict(raw, source="gpt-oss/config.json")
