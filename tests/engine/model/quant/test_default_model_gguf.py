"""The default model served from its own Q4_1 GGUF, packed: the same greedy tokens as its
fp32 conversion on the oracle prompts, from a quarter of the weight bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.llm import LLM
from engine.model.quant import gguf_file
from models.sampling_params import SamplingParams
from tests.engine.test_engine_oracle import PROMPTS


@pytest.fixture(scope="module")
def gguf_dir(default_model_dir: Path) -> Path:
    if gguf_file(default_model_dir) is None:
        pytest.skip("SPLITSERVE_TEST_MODEL_DIR points at a copy without the GGUF")
    return default_model_dir


def test_packed_greedy_equals_the_fp32_path(gguf_dir: Path) -> None:
    packed = LLM(gguf_dir, quantization="gguf", max_num_batched_tokens=48, num_kv_blocks=512)
    fp32 = LLM(gguf_dir, quantization="none", max_num_batched_tokens=48, num_kv_blocks=512)
    prompts = [
        fp32.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS
    ]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    want = [o.token_ids for o in fp32.generate(prompts, params)]
    got = [o.token_ids for o in packed.generate(prompts, params)]
    for prompt, g, w in zip(PROMPTS, got, want, strict=True):
        assert g == w, f"divergence for prompt {prompt[:40]!r}"
    packed_bytes = packed.engine.runner.model.weight_bytes()[0]
    fp32_bytes = fp32.engine.runner.model.weight_bytes()[0]
    assert packed_bytes < fp32_bytes / 4  # 6 bits a weight against 32


def test_a_cpu_engine_serves_the_gguf_by_default(gguf_dir: Path) -> None:
    llm = LLM(gguf_dir, num_kv_blocks=16)
    assert llm.engine.runner.model.quantized_weights()
