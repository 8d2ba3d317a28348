"""EngineConfig.int8_activations: the packed products of decode steps round the activations
to int8 per 16 inputs (engine.cpu_kernels.quant_int8). Its oracle criterion, against the exact
path on the same packed weights (int8_activations off), greedy with top-2 log-probabilities:

- every greedy divergence happens at a near tie: the exact path's top two choices within
  NEAR_TIE nats at the token where the two runs part (NEAR_TIE_MOE for a mixture of experts,
  where a slightly moved router input can pick another expert);
- before any divergence, the chosen tokens' log-probabilities differ by at most LOGPROB_ERROR;
- on the default model (the first 12 oracle prompts, 48 tokens each) at least MIN_KEPT prompts
  keep every token.

Measured on a 2-core AMD EPYC (AVX-512 VNNI at 16 lanes, AVX2 at 8): the default model kept 7
of 12 prompts at both widths (divergences at top-2 gaps of 0.01-0.21 nats, logprob error at
most 0.19); tiny Qwen3 (GPTQ) 7 of 12 (gaps up to 0.02), tiny Qwen3-MoE (GPTQ attention,
fp32 experts) 6 of 12 (gaps up to 0.65), the same at both widths: random tiny models have
many near ties.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from oracle_runs import GreedyRun, logprob_greedy
from quant_checkpoints import save_quantized

from engine.cpu_kernels import quant_int8
from engine.llm import LLM
from engine.model.quant.weight import QuantWeight
from engine.outputs import GenerationOutput
from models.sampling_params import SamplingParams
from tests.engine.model.tiny_families import save_family
from tests.engine.tiny_tokenizer import save_byte_tokenizer

pytestmark = pytest.mark.skipif(quant_int8.isa() == 0, reason="no integer-dot kernel here")
NEAR_TIE = 0.5  # nats
NEAR_TIE_MOE = 1.0
LOGPROB_ERROR = 0.3  # nats
MIN_KEPT = 6  # of the 12 oracle prompts


def compare(
    got: list[GenerationOutput], want: list[GenerationOutput], near_tie: float = NEAR_TIE
) -> int:
    """Check the near-tie and log-probability parts of the criterion; the prompts kept."""
    kept = 0
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.logprobs is not None and b.logprobs is not None
        pairs = zip(a.token_ids, b.token_ids, strict=True)
        step = next((s for s, (x, y) in enumerate(pairs) if x != y), None)
        same = len(a.token_ids) if step is None else step
        for s in range(same):
            err = abs(a.logprobs[s].top[0][1] - b.logprobs[s].top[0][1])
            assert err <= LOGPROB_ERROR, f"prompt {i}, token {s}: logprob off by {err:.3f}"
        if step is None:
            kept += 1
            continue
        (_, first), (_, second) = b.logprobs[step].top[:2]
        print(f"prompt {i}: diverges at token {step}, exact top-2 gap {first - second:.3f}")
        assert first - second < near_tie, f"prompt {i}: a decisive token changed"
    return kept


def test_default_model(default_model_dir: Path, fp32_logprob_run: GreedyRun) -> None:
    run = logprob_greedy(default_model_dir, int8_activations=True)
    assert run.prompts == fp32_logprob_run.prompts and run.free_after == run.total_blocks
    kept = compare(run.outputs, fp32_logprob_run.outputs)
    print(f"int8 activations kept {kept} of {len(run.outputs)} prompts' tokens")
    assert kept >= MIN_KEPT


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_tiny_qwen3(family: str, tmp_path: Path) -> None:
    save_quantized(save_family(family, tmp_path), tmp_path, "gptq")
    save_byte_tokenizer(tmp_path)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 40, (12,), generator=gen).tolist()
    prompts = [torch.randint(3, 120, (n,), generator=gen).tolist() for n in lengths]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=2)
    runs = []
    for int8 in (False, True):
        with LLM(tmp_path, num_kv_blocks=128, int8_activations=int8) as llm:
            weights = llm.engine.runner.model.quantized_weights()
            taken = [w for w in weights if isinstance(w, QuantWeight) and w.int8_kernel]
            assert bool(taken) == int8  # the attention projections at least
            runs.append(llm.generate(prompts, params))
    compare(runs[1], runs[0], NEAR_TIE_MOE if "moe" in family else NEAR_TIE)
