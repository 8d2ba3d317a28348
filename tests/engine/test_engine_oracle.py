"""The engine's greedy output equals transformers' on the default model (the oracle)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from oracle_runs import HF_NEW_TOKENS, chat_prompts
from tiny_llama import save_tiny_llama

from bench.oracle_prompts import PROMPTS
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.llm import LLM
from models.sampling_params import SamplingParams

NEW_TOKENS = HF_NEW_TOKENS  # 64: transformers' tokens come from the session (conftest.py)


@pytest.fixture(scope="module")
def llm(default_model_dir: Path) -> LLM:
    torch.manual_seed(0)
    # A small token budget forces chunked prefill: most prompts span several steps and
    # share steps with other requests' decodes.
    return LLM(default_model_dir, dtype="float32", max_num_batched_tokens=48, num_kv_blocks=512)


def test_greedy_batch_equals_transformers(
    llm: LLM, default_model_dir: Path, hf_oracle_tokens: list[list[int]]
) -> None:
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    lengths = [len(p) for p in prompts]
    assert max(lengths) - min(lengths) >= 40 and len(set(lengths)) >= 8  # mixed lengths
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    steps_before = llm.engine.counters.steps
    ours = llm.generate(prompts, params)
    assert llm.engine.counters.steps - steps_before >= NEW_TOKENS  # one batch, not 20 runs
    assert prompts == chat_prompts(default_model_dir, PROMPTS)  # the prompts transformers ran
    expected = hf_oracle_tokens  # the session's transformers run (conftest.py)
    for prompt, got, want in zip(PROMPTS, ours, expected, strict=True):
        assert got.token_ids == want, f"divergence for prompt {prompt[:40]!r}"
    assert llm.engine.stats().free_blocks == llm.engine.stats().total_blocks


def test_capital_of_france(llm: LLM) -> None:
    out = llm.chat(
        [[{"role": "user", "content": "What is the capital of France?"}]],
        SamplingParams(max_tokens=20, temperature=0.0),
    )
    assert "Paris" in out[0].text
    assert out[0].finish_reason is not None and out[0].finish_reason.value == "stop"


def test_prefix_cache_computes_only_new_tokens(default_model_dir: Path) -> None:
    engine_llm = LLM(default_model_dir, max_num_batched_tokens=256, num_kv_blocks=256)
    engine = engine_llm.engine
    shared = [(7 * i) % 40000 + 100 for i in range(200)]
    first = shared + [11, 12, 13]
    second = shared + [21, 22, 23, 24, 25]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    engine_llm.generate([first], params)
    before = engine.counters.tokens_computed
    warm = engine_llm.generate([second], params)[0]
    computed = engine.counters.tokens_computed - before
    cached = (200 // 16) * 16  # full blocks of the shared prefix
    assert computed == len(second) - cached + (params.max_tokens - 1)
    # The same request on a fresh engine (no cache) gives the same tokens.
    cold = LLM(default_model_dir, max_num_batched_tokens=256, num_kv_blocks=256)
    assert cold.generate([second], params)[0].token_ids == warm.token_ids


def test_kv_pressure_preempts_and_still_matches(default_model_dir: Path) -> None:
    prompts = [[(13 * i + 7 * j) % 30000 + 200 for j in range(40 + 9 * i)] for i in range(6)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    roomy = LLM(default_model_dir, num_kv_blocks=256, enable_prefix_caching=False)
    want = [o.token_ids for o in roomy.generate(prompts, params)]
    # 16 blocks of 16 tokens cannot hold six sequences of 64..109 tokens at once.
    tight = LLM(default_model_dir, num_kv_blocks=16, enable_prefix_caching=False)
    start_free = tight.engine.stats().free_blocks
    got = [o.token_ids for o in tight.generate(prompts, params)]
    assert tight.engine.counters.preemptions > 0
    assert got == want
    assert tight.engine.stats().free_blocks == start_free


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("max_tokens", 0),
        ("top_k", -1),
        ("min_p", 1.5),
        ("presence_penalty", 3.0),
        ("repetition_penalty", 0.0),
    ],
)
def test_bad_sampling_params_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_prompt_over_context_is_refused(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)  # the engine's checks: a tiny model loads in a fraction of the time
    engine = LLMEngine(EngineConfig(model_dir=tmp_path, num_kv_blocks=64, max_model_len=128))
    with pytest.raises(ValueError, match="context length"):
        engine.add_request("too-long", [100] * 128, SamplingParams())
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request("bad-token", [10**9], SamplingParams())
