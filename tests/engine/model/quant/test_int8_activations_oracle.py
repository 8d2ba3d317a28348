"""EngineConfig.int8_activations: every product of the packed weights rounds the activations
to int8 per block of 32 inputs (engine.cpu_kernels.quant_int8). Its oracle criterion, against
the exact path on the same packed weights (int8_activations off), is the rule vLLM's
quantization tests hold reduced-precision paths to (tests/engine/reduced_precision.py):

- greedy, with top-TOP_K log-probabilities: where a prompt's two token sequences first part,
  each path's token is within the other path's top TOP_K at that position; before it, the
  chosen tokens' log-probabilities differ by at most GREEDY_ERROR;
- teacher-forced: both paths score the exact path's tokens (prompt and greedy output) in one
  prefill; the chosen token's log-probability differs by at most FORCED_MAX at any generated
  position and by at most FORCED_MEAN on average over them.

Exact greedy equality is no criterion for a reduced-precision path: a near tie flips
(llama.cpp's own Q8 activations would fail it). Held on the default model (the first 12
oracle prompts, 48 tokens each) and on tiny random Qwen3 and Qwen3-MoE checkpoints (GPTQ,
12 random prompts, 24 tokens).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from oracle_runs import GreedyRun, logprob_greedy
from quant_checkpoints import save_quantized
from reduced_precision import (
    RoutingRecord,
    greedy_agreement,
    record_routing,
    routing_ties,
    teacher_forced_logprobs,
)

from engine.cpu_kernels import quant_int8
from engine.llm import LLM
from engine.model.quant.weight import QuantWeight
from engine.outputs import GenerationOutput
from models.sampling_params import SamplingParams
from tests.engine.model.tiny_families import save_family
from tests.engine.tiny_tokenizer import save_byte_tokenizer

pytestmark = pytest.mark.skipif(quant_int8.isa() == 0, reason="no integer-dot kernel here")
TOP_K = 5
GREEDY_ERROR = 0.3  # nats
FORCED_MAX = 0.5  # nats
FORCED_MEAN = 0.05  # nats
ROUTER_TIE = 0.05  # router logits: a near tie of the k-th and (k + 1)-th experts


def check(
    got: list[GenerationOutput],
    want: list[GenerationOutput],
    forced: tuple[list[torch.Tensor], list[torch.Tensor]],
    tied: list[frozenset[int]],
) -> None:
    """The criterion for int8 (got) against exact (want), per prompt; ``forced`` the
    teacher-forced log-probabilities of both, ``tied`` each prompt's generated positions
    where the experts flipped at a router near tie (held apart from the per-position
    bounds: see reduced_precision)."""
    errors, kept = [], []
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        agree = greedy_agreement(a, b, tied[i])
        print(f"prompt {i}: parts at {agree.diverged_at}, logprob error {agree.logprob_error:.3f}")
        assert agree.in_top_k or agree.diverged_at in tied[i], f"prompt {i}: outside the top"
        assert agree.logprob_error <= GREEDY_ERROR, f"prompt {i}: {agree.logprob_error:.3f}"
        error = (forced[0][i] - forced[1][i]).abs()
        errors.append(error)
        kept.append(error[[j for j in range(len(error)) if j not in tied[i]]])
    every, untied = torch.cat(errors), torch.cat(kept)
    print(f"teacher-forced: mean {every.mean():.4f}, max {every.max():.3f} ({untied.max():.3f} "
          f"without {sum(map(len, tied))} router near ties) nats")  # fmt: skip
    assert untied.max() <= FORCED_MAX and every.mean() <= FORCED_MEAN


def test_default_model(default_model_dir: Path, fp32_logprob_run: GreedyRun) -> None:
    exact = fp32_logprob_run
    scored = [p + list(o.token_ids) for p, o in zip(exact.prompts, exact.outputs, strict=True)]
    run = logprob_greedy(default_model_dir, score=scored, int8_activations=True)
    assert run.prompts == exact.prompts and run.free_after == run.total_blocks
    no_ties = [frozenset[int]() for _ in scored]
    check(run.outputs, exact.outputs, (list(run.forced), list(exact.forced)), no_ties)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_tiny_qwen3(family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_quantized(save_family(family, tmp_path), tmp_path, "gptq")
    save_byte_tokenizer(tmp_path)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 40, (12,), generator=gen).tolist()
    prompts = [torch.randint(3, 120, (n,), generator=gen).tolist() for n in lengths]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=TOP_K)
    record = record_routing(monkeypatch)
    runs: list[list[GenerationOutput]] = []
    forced: list[list[torch.Tensor]] = []
    routes: list[list[RoutingRecord]] = []
    scored: list[list[int]] = []
    for int8 in (False, True):
        with LLM(tmp_path, num_kv_blocks=128, int8_activations=int8) as llm:
            weights = llm.engine.runner.model.quantized_weights()
            taken = [w for w in weights if isinstance(w, QuantWeight) and w.int8_kernel]
            assert bool(taken) == int8  # the attention projections at least
            runs.append(llm.generate(prompts, params))
            scored = scored or [
                p + list(o.token_ids) for p, o in zip(prompts, runs[0], strict=True)
            ]
            forced.append([])
            routes.append([])
            for seq, prompt in zip(scored, prompts, strict=True):
                record.clear()
                forced[-1].append(teacher_forced_logprobs(llm, seq)[len(prompt) - 1 :])
                routes[-1].append(list(record))
    tied = [  # as generated positions (the token each position predicts)
        frozenset(t - len(p) + 1 for t in routing_ties(got, want, ROUTER_TIE))
        for got, want, p in zip(routes[1], routes[0], prompts, strict=True)
    ]
    assert ("moe" in family) == any(routes[0])
    check(runs[1], runs[0], (forced[1], forced[0]), tied)
