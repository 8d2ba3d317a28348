"""Qwen3-Next (Gated DeltaNet linear attention interleaved with gated full attention, MoE
with a gated shared expert) against transformers' own classes on a tiny random-weight model:
greedy tokens on the C, torch and Triton paths, prompts over several blocks prefilled in
chunks across steps (the state carried from chunk to chunk), two tensor-parallel ranks,
preemption, the state pool's slots given back, the KV layout naming the state (prefix-cache
hits: tests/engine/test_hybrid_prefix.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.kv.cache import KVLayout
from engine.model.config import ModelConfig
from tests.engine.model.test_families import NEW_TOKENS, PATHS, PROMPTS, greedy_tokens
from tests.engine.model.tiny_families import assert_greedy_near, hf_greedy_gaps, save_family

TIE = 1e-3  # logits of the top two tokens closer than this may swap with summation order


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    path = tmp_path_factory.mktemp("qwen3_next")
    return save_family("qwen3_next", path), path


def engine_of(path: Path, **kw: Any) -> LLMEngine:
    # blocks of 4 tokens and 16 tokens a step: every prompt spans blocks and steps
    values: dict[str, Any] = {
        "model_dir": path, "dtype": "float32", "block_size": 4, "num_kv_blocks": 128,
        "max_num_batched_tokens": 16,
    }  # fmt: skip
    return LLMEngine(EngineConfig(**values | kw))


def check(hf: Any, prompts: list[list[int]], got: list[list[int]]) -> None:
    for prompt, tokens in zip(prompts, got, strict=True):
        want, gaps = hf_greedy_gaps(hf, prompt, NEW_TOKENS)
        assert_greedy_near(tokens, want, gaps, TIE)


def assert_idle(engine: LLMEngine) -> None:
    """Every KV block and every state slot back in the pools."""
    stats = engine.stats()
    assert stats.free_blocks == stats.total_blocks
    assert stats.free_state_slots == stats.total_state_slots > 0


@pytest.mark.parametrize("path_name", list(PATHS))
def test_greedy_equals_transformers(hybrid: tuple[Any, Path], path_name: str) -> None:
    if path_name == "triton":
        pytest.importorskip("triton")
    hf, path = hybrid
    prompts = PROMPTS if path_name != "triton" else PROMPTS[:2]
    engine = engine_of(path, **PATHS[path_name])
    check(hf, prompts, greedy_tokens(engine, prompts))
    assert_idle(engine)


@pytest.mark.parametrize("budget", [5, 64])
def test_chunked_prefill_carries_the_state_across_steps(
    hybrid: tuple[Any, Path], budget: int
) -> None:
    """A budget of 5 tokens a step cuts every prompt into chunks of odd sizes that start
    mid-block; a budget of 64 prefills all three in one step (one chunk each)."""
    hf, path = hybrid
    engine = engine_of(path, attention_backend="torch", max_num_batched_tokens=budget)
    check(hf, PROMPTS, greedy_tokens(engine, PROMPTS))
    assert_idle(engine)


def test_a_preempted_request_resumes_with_the_same_tokens(hybrid: tuple[Any, Path]) -> None:
    """Too few blocks for the three prompts at once: requests are preempted (their state
    slot given back) and recomputed from zeros, and every token is still transformers'
    (swapped instead: tests/engine/test_hybrid_swap.py)."""
    hf, path = hybrid
    engine = engine_of(path, attention_backend="torch", num_kv_blocks=12)
    check(hf, PROMPTS, greedy_tokens(engine, PROMPTS))
    assert engine.counters.preemptions > 0
    assert_idle(engine)


def test_two_tensor_parallel_ranks_answer_as_transformers(hybrid: tuple[Any, Path]) -> None:
    """Each rank holds one of the two key heads of the linear layers (their conv channels,
    state and gated norm) and one KV head; prompts prefilled in chunks across steps."""
    hf, path = hybrid
    engine = engine_of(path, attention_backend="torch", tensor_parallel_size=2)
    try:
        check(hf, PROMPTS, greedy_tokens(engine, PROMPTS))
        assert_idle(engine)
    finally:
        engine.close()


def test_an_abort_mid_prefill_gives_the_slot_back(hybrid: tuple[Any, Path]) -> None:
    _, path = hybrid
    engine = engine_of(path, attention_backend="torch", max_num_batched_tokens=8)
    from models.sampling_params import SamplingParams

    engine.add_request("a", PROMPTS[0], SamplingParams(max_tokens=4, temperature=0.0))
    engine.step()  # the first chunk of 8 tokens: the request holds a slot
    assert engine.stats().free_state_slots == engine.stats().total_state_slots - 1
    assert engine.abort("a")
    assert_idle(engine)


def test_the_cache_holds_only_the_attention_layers(hybrid: tuple[Any, Path]) -> None:
    """Two of the four layers keep K/V; the fingerprint names the state's shape, so a
    layout of the same blocks without it (or with another state) never matches."""
    _, path = hybrid
    config = ModelConfig.from_dir(path)
    assert config.kv_layers == (1, 3) and config.rope_dims == 8
    layout = KVLayout.for_model(config, "float32", 4)
    assert layout.block_shape == (2, 2, 4, 2, 16)
    assert "gdn-state[layers=2,conv=96x3,recurrent=4x16x8:float32]" in layout.describe()
    plain = KVLayout(layout.model, "float32", 4, 2, 2, 16)
    assert plain.fingerprint() != layout.fingerprint()
    assert layout.fingerprint() != KVLayout(**{**vars(layout), "state": "other"}).fingerprint()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"layer_types": ["linear_attention"] * 4}, "no full_attention layer"),
        ({"layer_types": ["linear_attention", "mamba", "full_attention", "full_attention"]},
         "'mamba'"),
        ({"linear_num_value_heads": 3}, "multiple of linear_num_key_heads"),
        ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act"),
    ],
)  # fmt: skip
def test_a_bad_config_is_refused_by_name(
    hybrid: tuple[Any, Path], change: dict[str, Any], named: str
) -> None:
    hf, _ = hybrid
    raw = hf.config.to_dict() | change
    with pytest.raises(ValueError, match=named):
        ModelConfig.from_dict(raw, source="qwen3_next/config.json")


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"pipeline_parallel_size": 2}, "pipeline_parallel_size=2"),
        ({"speculative_method": "ngram"}, "speculative_method='ngram'"),
        (
            {"kv_offload_cpu_gb": 0.01, "kv_offload_disk_path": "kv", "kv_offload_disk_gb": 0.01},
            "kv_offload_disk_path",
        ),
        ({"enable_lora": True}, "enable_lora"),
    ],
)
def test_settings_not_built_for_hybrid_models_are_refused(
    hybrid: tuple[Any, Path], setting: dict[str, Any], named: str
) -> None:
    _, path = hybrid
    with pytest.raises(ValueError, match=named):
        engine_of(path, **setting)
