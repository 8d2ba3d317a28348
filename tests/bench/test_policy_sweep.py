"""The policy sweep's arithmetic: rounds pooled per policy, ratios to the first policy."""

from __future__ import annotations

from typing import Any

from bench.multiturn import Multiturn
from bench.policy_sweep import aggregate, fewest_computed, table
from bench.workloads import Lengths


def _record(ttft: float, prompt: int, cached: int) -> dict[str, Any]:
    return {
        "error": None, "ttft": ttft, "tpot": 0.1, "itl": [0.1], "e2e": ttft + 1,
        "prompt_tokens": prompt, "output_tokens": 2, "cached_tokens": cached,
    }  # fmt: skip


def _run(policy: str, ttft: float, cached: int, longest: int) -> dict[str, Any]:
    records = [_record(ttft, 100, cached), _record(ttft * 3, 100, cached)]
    kv = {"prefill": {"routed_longest": longest, "routed_shorter": 2 - longest}}
    return {"policy": policy, "prefill_node_tokens_computed": 2 * (100 - cached),
            "decode_imported_blocks": 5, "router_kv": kv, "duration_s": 10.0,
            "records": records}  # fmt: skip


def test_rounds_are_pooled_and_compared_to_the_first_policy() -> None:
    runs = [_run("round_robin", 1.0, 20, 1), _run("kv_aware", 0.5, 60, 2)]
    runs += [_run("round_robin", 1.0, 20, 0), _run("kv_aware", 0.5, 60, 1)]
    summaries = aggregate(runs)
    assert list(summaries) == ["round_robin", "kv_aware"]
    kv = summaries["kv_aware"]
    assert kv["prefix"]["computed_prompt_tokens"] == 4 * 40
    assert kv["prefill_node_tokens_computed"] == 4 * 40
    assert kv["ttft_ms"]["p50"] == 1000.0  # median of 0.5, 0.5, 1.5, 1.5 s
    rows = table(summaries).splitlines()
    assert rows[3].startswith("| kv_aware | 4/4 | 400 | 160 | 160 | 0.50 | 1000 | 2.00x |")
    # prefill requests sent to the node with the longest cached prefix: 3 of 4, 1 of 4
    assert rows[3].endswith("| 75% | - | 10 |")
    assert rows[2].endswith("| 25% | - | 10 |")


def test_the_bound_counts_each_turns_new_tokens_and_the_system_prompt_once_per_node() -> None:
    fixed = Lengths(16, 16)
    shape = Multiturn(users=2, turns=2, system=32, question=fixed, answer=fixed)
    # user 0: turn 1 computes all 48 tokens, turn 2 (80) reuses turn 1's 3 blocks;
    # user 1: turn 1 reuses the 2 system blocks, turn 2 reuses its turn 1's 3 blocks
    assert fewest_computed(shape, seed=0, prefill_nodes=1) == 48 + 32 + 16 + 32
    # with 2 prefill nodes both first conversations compute the system prompt
    assert fewest_computed(shape, seed=0, prefill_nodes=2) == 48 + 32 + 48 + 32
