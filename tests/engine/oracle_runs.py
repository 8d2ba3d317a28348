"""Runs of the default model that several oracle tests compare against, computed once per
session by the fixtures in this folder's conftest.py:

- transformers' float32 greedy tokens of every oracle prompt (test_engine_oracle,
  speculative/test_speculative_oracle);
- the engine's float32 greedy run of the first 12 oracle prompts with top-5 log-probabilities
  and its tokens scored teacher-forced (test_matmul_precision_oracle with
  float32_matmul_precision "highest", test_kv_dtype_oracle with kv_cache_dtype "auto",
  test_int8_activations_oracle with int8_activations off: the defaults of all three).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lora_adapters import hf_greedy_batched, merged_model
from reduced_precision import teacher_forced_logprobs

from bench.oracle_prompts import PROMPTS
from engine.kv.cache import KVLayout
from engine.llm import LLM
from engine.outputs import GenerationOutput
from models.sampling_params import SamplingParams
from models.tokenizer import Tokenizer

HF_NEW_TOKENS = 64  # transformers' reference: tokens per oracle prompt
LOGPROB_PROMPTS = PROMPTS[:12]  # the engine runs with log-probabilities
LOGPROB_NEW_TOKENS = 48
LOGPROB_TOP = 5


def chat_prompts(model_dir: Path, prompts: list[str]) -> list[list[int]]:
    tokenizer = Tokenizer.from_dir(model_dir)
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]


def hf_fp32_greedy(model_dir: Path) -> list[list[int]]:
    """transformers' float32 greedy tokens, HF_NEW_TOKENS for each chat-templated oracle
    prompt: plain greedy decoding with transformers' own model and KV cache (not
    `generate(min_new_tokens=...)`: that bans EOS, while ignore_eos only keeps going).
    Batched: on a 2-core Xeon the tokens equal `hf_greedy`'s prompt-by-prompt run (in 7 s
    instead of 40 s)."""
    return hf_greedy_batched(
        merged_model(model_dir, None), chat_prompts(model_dir, PROMPTS), HF_NEW_TOKENS
    )


@dataclass(frozen=True)
class GreedyRun:
    """One engine's greedy run of LOGPROB_PROMPTS and what the tests check about the engine."""

    prompts: list[list[int]]
    outputs: list[GenerationOutput]
    layout: KVLayout
    free_before: int
    free_after: int
    total_blocks: int
    decoder_layers: int
    bf16_products: int  # packed layers whose products take bf16 inputs
    bf16_prefill: bool  # prefill attention in bf16
    # per prompt, the log-probabilities of the scored sequence's generated tokens, teacher-forced
    forced: tuple[torch.Tensor, ...]


def logprob_greedy(
    model_dir: Path, score: list[list[int]] | None = None, **engine_options: Any
) -> GreedyRun:
    """The greedy run of the logprob oracle: 256 KV blocks, top-5 log-probabilities; then
    ``score`` (prompt and generated tokens, one sequence per prompt; None: this run's own)
    scored teacher-forced."""
    llm = LLM(model_dir, num_kv_blocks=256, **engine_options)
    try:
        prompts = [
            llm.tokenizer.apply_chat_template([{"role": "user", "content": p}])
            for p in LOGPROB_PROMPTS
        ]
        params = SamplingParams(
            max_tokens=LOGPROB_NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=LOGPROB_TOP
        )
        free_before = llm.engine.stats().free_blocks
        outputs = llm.generate(prompts, params)
        stats = llm.engine.stats()
        model = llm.engine.runner.model
        score = score or [p + list(o.token_ids) for p, o in zip(prompts, outputs, strict=True)]
        forced = tuple(
            teacher_forced_logprobs(llm, s)[len(p) - 1 :]
            for s, p in zip(score, prompts, strict=True)
        )
        taken = [w for w in model.quantized_weights() if getattr(w, "bf16_products", False)]
        return GreedyRun(
            prompts=prompts,
            outputs=outputs,
            layout=llm.engine.runner.layout,
            free_before=free_before,
            free_after=stats.free_blocks,
            total_blocks=stats.total_blocks,
            decoder_layers=len(model.decoder_layers()),
            bf16_products=len(taken),
            bf16_prefill=bool(model.attention.bf16_prefill),
            forced=forced,
        )
    finally:
        llm.close()
