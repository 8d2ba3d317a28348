"""Preemption of a hybrid model's requests (Qwen3-Next): with a host KV tier a preempted
request's linear-attention states go to the host swap space with its blocks and come back
when it resumes; with no room there (or no tier) it is recomputed from zeros. Either way
its tokens are transformers', and no state slot, swap room or block is left held after a
finish or an abort."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tier_driver import gib

from engine.config import EngineConfig
from engine.engine import LLMEngine
from models.sampling_params import SamplingParams
from tests.engine.model.test_families import NEW_TOKENS, PROMPTS, greedy_tokens
from tests.engine.model.tiny_families import assert_greedy_near, hf_greedy_gaps, save_family

TIE = 1e-3  # logits of the top two tokens closer than this may swap with summation order


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    path = tmp_path_factory.mktemp("qwen3_next")
    return save_family("qwen3_next", path), path


@pytest.fixture(scope="module")
def expected(hybrid: tuple[Any, Path]) -> list[tuple[list[int], list[float]]]:
    hf, _ = hybrid
    return [hf_greedy_gaps(hf, prompt, NEW_TOKENS) for prompt in PROMPTS]


def tight(path: Path, swap_room: int | None, **kw: Any) -> LLMEngine:
    """Too few blocks for the three prompts at once; with ``swap_room``, a host tier and
    room for that many requests' states (0: none, the space is full), swapping preferred
    (the rates set)."""
    tier = {"kv_offload_cpu_gb": gib(64)} if swap_room is not None else {}
    engine = LLMEngine(
        EngineConfig(
            model_dir=path, dtype="float32", block_size=4, num_kv_blocks=12,
            max_num_batched_tokens=16, attention_backend="torch", **tier, **kw,
        )
    )  # fmt: skip
    rule = engine.stepper.swap
    if rule is not None and swap_room is not None:
        engine.stepper.swap = None  # the rates stay as set: swapping is the cheaper
        rule.copy_bytes_per_s, rule.prefill_tokens_per_s = 1e12, 1.0
        assert engine.runner.state_swap is not None
        engine.runner.state_swap.capacity = swap_room
    return engine


def assert_idle(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats.free_blocks == stats.total_blocks
    assert stats.free_state_slots == stats.total_state_slots > 0
    assert stats.swapped_states == 0


@pytest.mark.parametrize(
    ("swap_room", "swapped", "recomputed"),
    [(None, False, True), (8, True, False), (0, False, True)],
    ids=["recompute", "swap", "swap-space-full"],
)
def test_a_preempted_request_resumes_with_the_same_tokens(
    hybrid: tuple[Any, Path],
    expected: list[tuple[list[int], list[float]]],
    swap_room: int | None,
    swapped: bool,
    recomputed: bool,
) -> None:
    engine = tight(hybrid[1], swap_room)
    for tokens, (want, gaps) in zip(greedy_tokens(engine, PROMPTS), expected, strict=True):
        assert_greedy_near(tokens, want, gaps, TIE)
    counters = engine.counters
    assert (counters.preemptions_swap > 0) == swapped
    assert (counters.preemptions_recompute > 0) == recomputed
    if engine.runner.state_swap is not None:
        assert engine.runner.state_swap.swapped_in == counters.preemptions_swap
    assert_idle(engine)
    engine.close()


def test_an_abort_while_swapped_out_drops_the_states(hybrid: tuple[Any, Path]) -> None:
    engine = tight(hybrid[1], 8)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    swap = engine.runner.state_swap
    assert swap is not None
    steps = 0
    while not any(map(swap.holds_copy, ("0", "1", "2"))):
        steps += 1
        assert steps < 200, "no request was swapped out"
        engine.step()
    victim = next(r for r in ("0", "1", "2") if swap.holds_copy(r))
    assert engine.stats().swapped_states == 1 and swap.num_bytes > 0
    assert engine.abort(victim)
    assert not swap.holds_copy(victim)
    while engine.has_unfinished():
        engine.step()
    assert_idle(engine)
    engine.close()
