"""Greedy decoding with prompt lookup gives transformers' tokens on the oracle prompts."""

from __future__ import annotations

from pathlib import Path

import pytest
from oracle_runs import chat_prompts
from test_engine_oracle import NEW_TOKENS, PROMPTS

from engine.llm import LLM
from models.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("every_guess")  # guesses independent of timing

# a third of the oracle prompts, mixed lengths (the whole set costs minutes on 2 cores)
ORACLE = PROMPTS[::3]


def test_greedy_ngram_equals_transformers(
    default_model_dir: Path, hf_oracle_tokens: list[list[int]]
) -> None:
    llm = LLM(
        default_model_dir,
        dtype="float32",
        max_num_batched_tokens=64,  # chunked prefill beside speculative chunks
        num_kv_blocks=512,
        speculative_method="ngram",
        num_speculative_tokens=4,
    )
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in ORACLE]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    ours = llm.generate(prompts, params)
    stats = llm.engine.speculative_stats
    assert stats is not None and 0 < stats.accepted < stats.proposed
    assert prompts == chat_prompts(default_model_dir, PROMPTS)[::3]
    expected = hf_oracle_tokens[::3]  # the session's transformers run (conftest.py)
    for prompt, got, want in zip(ORACLE, ours, expected, strict=True):
        assert got.token_ids == want, f"divergence for prompt {prompt[:40]!r}"
    assert llm.engine.stats().free_blocks == llm.engine.stats().total_blocks
