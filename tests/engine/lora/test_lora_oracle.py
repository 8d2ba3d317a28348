"""A random LoRA made with peft on the default model: the engine's greedy output equals
transformers with the adapter merged, on the oracle prompts, in one batch."""

from __future__ import annotations

from pathlib import Path

import pytest
from lora_adapters import hf_greedy, hf_greedy_batched, make_adapter, merged_model
from test_engine_oracle import PROMPTS

from engine import LLM, LoRARequest
from models.sampling_params import SamplingParams

NEW_TOKENS = 16

pytestmark = [pytest.mark.model, pytest.mark.timeout(1800)]  # 20 prompts, transformers too


def test_greedy_with_adapter_equals_transformers_merged(
    default_model_dir: Path, tmp_path: Path
) -> None:
    path = make_adapter(default_model_dir, tmp_path / "adapter", seed=3, rank=8, b_scale=0.25)
    llm = LLM(
        default_model_dir, enable_lora=True, max_lora_rank=8, max_num_batched_tokens=256,
        num_kv_blocks=512,
    )  # fmt: skip
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    ours = llm.generate(prompts, params, lora_request=LoRARequest("oracle", 1, path))
    # batched: on a 2-core Xeon the same tokens as hf_greedy's prompt-by-prompt run, 3x faster
    want = hf_greedy_batched(merged_model(default_model_dir, path), prompts, NEW_TOKENS)
    base = hf_greedy(merged_model(default_model_dir, None), prompts[:2], NEW_TOKENS)
    assert base != want[:2]  # the adapter changes the tokens
    for prompt, got, expected in zip(PROMPTS, ours, want, strict=True):
        assert got.token_ids == expected, f"divergence for prompt {prompt[:40]!r}"
    assert llm.engine.stats().free_blocks == llm.engine.stats().total_blocks
