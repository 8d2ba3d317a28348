"""int8 KV on the default model against float32 KV: at least 10 of the 12 oracle prompts keep
their 48 greedy tokens (issue 26), every change is at a near-tie of float32's, and over 3.5x
the tokens fit in the same KV memory.

The count is a lottery around the error's size: a prompt flips when its smallest top-2 gap
within 48 tokens is below the step's perturbation, and summation order alone moves it. With
the keys stored as they come out of RoPE, the int8 rows kept 8 to 10 of 12 by machine and
kernels (bfloat16 KV: 10), and 75 of 100 chat prompts. Keys stored Hadamard-rotated
(engine.kv_format.rows.rotate_heads_: their outlier channels spread before rounding, q rotated
alike) keep 11 of 12 on a 2-core AVX-512 / AMX Xeon, with 16- and 8-lane kernels and with
one thread or two, 12 of 12 on a 2-core AMD EPYC at either width, and 77 of 100 chat prompts;
on 12 prompts no test reads (bench.kv_greedy) 10 at either width on the EPYC. The prompts
that flip do so where float32's top-2 log-probabilities were under NEAR_TIE apart.
"""

from __future__ import annotations

from pathlib import Path

from oracle_runs import LOGPROB_NEW_TOKENS, LOGPROB_PROMPTS, GreedyRun, logprob_greedy

from bench.kv_greedy import partings
from engine.config import EngineConfig
from engine.kv.sizing import plan_kv_cache

ORACLE = LOGPROB_PROMPTS  # the first 12 oracle prompts
NEW_TOKENS = LOGPROB_NEW_TOKENS  # 48
MIN_SAME = 10  # of 12 (issue 26); measured 11 and 12 (see above)
NEAR_TIE = 0.5  # nats between float32's top two choices where int8 KV may pick the other


def _check(run: GreedyRun, kv_cache_dtype: str) -> None:
    assert run.layout.kv_dtype == kv_cache_dtype
    assert run.free_after == run.free_before


def _no_gpu() -> None:
    raise AssertionError("sized on the CPU: no device measurement")


def test_int8_kv_changes_only_near_tied_tokens_of_fp32_kv(
    default_model_dir: Path, fp32_logprob_run: GreedyRun
) -> None:
    _check(fp32_logprob_run, "auto")  # the session's float32 run (conftest.py)
    int8_run = logprob_greedy(default_model_dir, kv_cache_dtype="int8")
    _check(int8_run, "int8")
    assert int8_run.prompts == fp32_logprob_run.prompts
    fp32, int8 = fp32_logprob_run.layout, int8_run.layout
    parted = partings(fp32_logprob_run.outputs, int8_run.outputs)
    for p in parted:
        prompt = ORACLE[p.prompt][:30]
        print(f"{prompt!r}: int8 KV diverges at token {p.token}, float32 top-2 gap {p.gap:.3f}")
        assert p.gap < NEAR_TIE, f"{prompt!r}: a decisive token changed (gap {p.gap:.3f})"
    same = len(ORACLE) - len(parted)
    print(f"{same} of {len(ORACLE)} prompts kept their {NEW_TOKENS} tokens")
    assert same >= MIN_SAME, f"{same} of {len(ORACLE)} prompts kept their 48 tokens"
    config = EngineConfig(model_dir=default_model_dir, kv_cache_memory_gb=0.5)
    tokens = [plan_kv_cache(config, layout, _no_gpu).num_tokens for layout in (fp32, int8)]
    assert tokens[1] / tokens[0] >= 3.5, tokens  # 256 / 72 bytes per row: 3.56x
