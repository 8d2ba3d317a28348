"""The default model (SmolLM2-135M: 9 heads over 3 KV heads, split 1 + 2 KV groups over 2
ranks; 30 layers, 15 per pipeline stage) gives the same greedy answers with two ranks, or
two stages, as with one."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.llm import LLM
from models.sampling_params import SamplingParams

PROMPTS = [
    "What is the capital of France?",
    "List three prime numbers greater than 100.",
    "Why is the sky blue? Answer briefly.",
    "Write a Python function that reverses a string.",
]
NEW_TOKENS = 32
pytestmark = pytest.mark.model


def _answers(model_dir: Path, tp: int, pp: int = 1) -> list[list[int]]:
    llm = LLM(
        model_dir,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        num_kv_blocks=64,
        max_num_batched_tokens=48,
    )
    try:
        prompts = [
            llm.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS
        ]
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        return [out.token_ids for out in llm.generate(prompts, params)]
    finally:
        llm.close()


@pytest.fixture(scope="module")
def one_rank(default_model_dir: Path) -> list[list[int]]:
    return _answers(default_model_dir, 1)


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_two_ranks_answer_as_one(
    default_model_dir: Path, one_rank: list[list[int]], tp: int, pp: int
) -> None:
    two = _answers(default_model_dir, tp, pp)
    for prompt, a, b in zip(PROMPTS, one_rank, two, strict=True):
        assert a == b, f"divergence for prompt {prompt!r}"
