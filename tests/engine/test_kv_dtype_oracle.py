"""int8 KV on the default model against float32 KV: the same 48 greedy tokens on at least 10
of the first 12 oracle prompts (issue 26), and over 3.5x the tokens in the same KV memory.

Quantised K/V move near-tied logits, so the count is a lottery around the error's size: a
prompt flips when its smallest top-2 logit gap within 48 tokens is below the step's
perturbation. Measured on a 2-core Xeon (C kernels), fp32 K/V rounded to each format: bfloat16
KV 10 of 12 (prompt 5 flips at any perturbation); int8 with one fp32 scale per row 8, four
groups of 16 channels with a scale each 9, a scale and a zero point per half row 9, rotary
quarter pairs with an fp16 scale each 11 but 7 with fp32 scales (the count moves with the
rounding of the scale alone: only the error's size, engine.kv.quant, ranks formats). The
int8 cache as built (a bf16 scale and mid per half row, the C kernel's sums): 10 of 12, at
the threshold; with the C kernels off (SPLITSERVE_CPU_KERNELS=0, torch's sums on both sides)
8 of 12. A change of summation order moves the count.
"""

from __future__ import annotations

from pathlib import Path

from test_engine_oracle import PROMPTS

from engine.config import EngineConfig
from engine.kv.cache import KVLayout
from engine.kv.sizing import plan_kv_cache
from engine.llm import LLM
from models.sampling_params import SamplingParams

ORACLE = PROMPTS[:12]
NEW_TOKENS = 48
MIN_SAME = 10  # issue 26's acceptance


def _greedy(model_dir: Path, kv_cache_dtype: str) -> tuple[list[list[int]], KVLayout]:
    llm = LLM(model_dir, kv_cache_dtype=kv_cache_dtype, num_kv_blocks=256)
    layout = llm.engine.runner.layout
    assert layout.kv_dtype == kv_cache_dtype
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in ORACLE]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    start = llm.engine.stats().free_blocks
    out = [o.token_ids for o in llm.generate(prompts, params)]
    assert llm.engine.stats().free_blocks == start
    return out, layout


def _no_gpu() -> None:
    raise AssertionError("sized on the CPU: no device measurement")


def test_int8_kv_keeps_the_greedy_tokens_of_fp32_kv(default_model_dir: Path) -> None:
    want, fp32 = _greedy(default_model_dir, "auto")
    got, int8 = _greedy(default_model_dir, "int8")
    same = sum(a == b for a, b in zip(got, want, strict=True))
    assert same >= MIN_SAME, f"{same} of {len(ORACLE)} prompts kept their 48 tokens"
    config = EngineConfig(model_dir=default_model_dir, kv_cache_memory_gb=0.5)
    tokens = [plan_kv_cache(config, layout, _no_gpu).num_tokens for layout in (fp32, int8)]
    assert tokens[1] / tokens[0] >= 3.5, tokens  # 256 / 72 bytes per row: 3.56x
