"""Preemption by swapping to the host KV tier or by recomputing, chosen by the cost rule: a
burst on a device cache too small for it gives the tokens of a cache big enough for it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tier_driver import back_to_start, engine, gib, prompt
from tiny_llama import save_tiny_llama

from engine.engine import LLMEngine
from engine.scheduler.swap import SwapRule
from models.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("swap")
    save_tiny_llama(path)
    return path


def burst(eng: LLMEngine) -> dict[str, list[int]]:
    """Eight requests at once, greedy and seeded sampling, run to their end."""
    for i in range(8):
        params = SamplingParams(max_tokens=14, temperature=0.0 if i % 2 else 0.8, seed=i)
        eng.add_request(f"r{i}", prompt(i, 9 + 3 * i), params)
    out: dict[str, list[int]] = {}
    steps = 0
    while eng.has_unfinished():
        steps += 1
        assert steps < 1000, "no progress"
        for o in eng.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        eng.scheduler.audit()
    return out


def test_a_burst_swaps_and_recomputes_and_answers_as_without_preemption(tiny_dir: Path) -> None:
    roomy = engine(tiny_dir, num_kv_blocks=200, max_num_seqs=8)
    expected = burst(roomy)
    assert roomy.counters.preemptions == 0
    tight = engine(tiny_dir, num_kv_blocks=24, max_num_seqs=8, kv_offload_cpu_gb=gib(6))
    rule = tight.stepper.swap
    assert rule is not None
    tight.stepper.swap = None  # the rates stay as set: swapping is the cheaper
    rule.copy_bytes_per_s, rule.prefill_tokens_per_s = 1e12, 1.0
    assert burst(tight) == expected
    counters = tight.counters
    assert counters.preemptions_swap > 0  # while the host tier had room
    assert counters.preemptions_recompute > 0  # when it had none
    assert counters.preemptions == counters.preemptions_swap + counters.preemptions_recompute
    back_to_start(tight)
    tight.close()


def test_the_rule_weighs_copy_bytes_against_tokens_to_recompute() -> None:
    rule = SwapRule(block_bytes=1000, copy_bytes_per_s=1e6, prefill_tokens_per_s=100.0)
    # 10 blocks out and back: 20 ms; 64 tokens: 640 ms; 1 token: 10 ms
    assert rule.prefers_swap(num_blocks=10, num_tokens=64)
    assert not rule.prefers_swap(num_blocks=10, num_tokens=1)
    assert not rule.prefers_swap(num_blocks=1, num_tokens=0)
    rule.observe(num_tokens=1000, seconds=0.1)  # 10k tokens/s: recomputing got cheaper
    assert rule.prefill_tokens_per_s > 100.0
    rule.observe(num_tokens=4, seconds=10.0)  # too few tokens to say anything
    assert rule.prefill_tokens_per_s > 100.0
    with pytest.raises(ValueError, match="rates must be > 0"):
        SwapRule(block_bytes=1, copy_bytes_per_s=0.0)
