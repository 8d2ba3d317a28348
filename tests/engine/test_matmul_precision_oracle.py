"""float32_matmul_precision "medium" on the default model: the packed layers' products over
many rows and the prefill attention of whole prompts take bf16 inputs (quant_amx_bf16.c,
prefill_attention_amx.c), so greedy tokens may leave float32's only where float32's own top
two choices were nearly tied, and they stay closer to float32's than transformers running the
model in bfloat16 (a bf16 model's precision, what vLLM's CPU backend serves). Where the build
has no AMX tiles "medium" changes nothing.

Measured on a 2-core Xeon (AVX-512 + AMX), the products and the prefill attention in bf16: 10
of the first 12 oracle prompts kept float32's 48 tokens (divergences at top-2 gaps of 0.026
and 0.003 nats); transformers in bfloat16 kept 7.
"""

from __future__ import annotations

from pathlib import Path

import torch
from lora_adapters import hf_greedy, merged_model
from oracle_runs import LOGPROB_NEW_TOKENS, LOGPROB_PROMPTS, GreedyRun, logprob_greedy

from engine.cpu_kernels.quant_linear import amx_available

ORACLE = LOGPROB_PROMPTS  # the first 12 oracle prompts
NEW_TOKENS = LOGPROB_NEW_TOKENS  # 48
NEAR_TIE = 0.5  # nats between float32's top two choices where bf16 products may pick the other


def _check(run: GreedyRun, precision: str) -> None:
    assert run.free_after == run.total_blocks
    medium = precision == "medium" and amx_available()
    # qkv, o, gate_up, down
    assert run.bf16_products == (4 * run.decoder_layers if medium else 0)
    assert run.bf16_prefill == medium


def test_medium_leaves_fp32_only_at_near_ties_and_less_than_bf16(
    default_model_dir: Path, fp32_logprob_run: GreedyRun
) -> None:
    _check(fp32_logprob_run, "highest")  # the session's float32 run (conftest.py)
    prompts, want = fp32_logprob_run.prompts, fp32_logprob_run.outputs
    medium = logprob_greedy(default_model_dir, float32_matmul_precision="medium")
    _check(medium, "medium")
    assert medium.prompts == prompts
    got = medium.outputs
    if not amx_available():
        assert [a.token_ids for a in got] == [b.token_ids for b in want]
        return
    same = 0
    for prompt, a, b in zip(ORACLE, got, want, strict=True):
        if a.token_ids == b.token_ids:
            same += 1
            continue
        step = next(
            i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=True)) if x != y
        )
        assert b.logprobs is not None
        (_, first), (_, second) = b.logprobs[step].top[:2]
        print(f"{prompt[:30]!r}: medium diverges at token {step}, float32 top-2 gap "
              f"{first - second:.3f}")  # fmt: skip
        assert first - second < NEAR_TIE, f"{prompt[:30]!r}: a decisive token changed"
    model = merged_model(default_model_dir, None).to(torch.bfloat16)
    # each prompt only until its first token unlike float32's: the count is the same
    bf16 = hf_greedy(model, prompts, NEW_TOKENS, until_unlike=[b.token_ids for b in want])
    bf16_same = sum(t == b.token_ids for t, b in zip(bf16, want, strict=True))
    print(f"medium kept {same} of {len(ORACLE)} prompts' tokens, transformers bf16 {bf16_same}")
    assert same >= bf16_same
