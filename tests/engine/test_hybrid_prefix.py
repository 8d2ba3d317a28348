"""Prefix-cache hits of a hybrid model (Qwen3-Next) from state checkpoints at block
boundaries: a prompt that repeats another's leading blocks resumes from the linear layers'
state saved there, on the C, torch and Triton paths, prefilled in chunks or whole, on two
tensor-parallel ranks, through preemption and in the prefill role (which ships the state
after the hit); its tokens are transformers'. Without a checkpoint (none kept, or evicted)
there is no hit, and nothing (blocks, state slots, checkpoint saves) is left held after a
finish, an abort or a failed step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tier_driver import gib

from decode_node.importer import transfer_pairs
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.kv.state_checkpoints import StateCheckpoints
from models.sampling_params import SamplingParams
from tests.engine.model.test_families import NEW_TOKENS, PATHS, PROMPTS
from tests.engine.model.tiny_families import assert_greedy_near, hf_greedy_gaps, save_family

TIE = 1e-3  # logits of the top two tokens closer than this may swap with summation order
PARAMS = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
SHARED = PROMPTS[2][:16]  # four blocks of 4
FIRST = SHARED + [5, 6, 7]  # 19 tokens: its checkpoint at 16, the end of the shared blocks
SECOND = SHARED + [40, 41, 42, 43, 44]  # matches the four blocks, resumes at 16
SYSTEM = PROMPTS[0][:12]  # three blocks a prompt starts with, then goes its own way
ASKS = [SYSTEM + [30 + k, 31, 32, 33, 34, 35, 36] for k in range(3)]
# prefilled a token a step beside three decodes: its checkpoint at 8 saved by a chunk of one
# token, then read by another prompt and by one whose chunk after the hit is one token
SLOW, AFTER, REPEAT = SHARED[:8] + [5, 6, 7], SHARED[:8] + [40, 41, 42, 43, 44], SHARED[:9]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    path = tmp_path_factory.mktemp("qwen3_next")
    return save_family("qwen3_next", path), path


@pytest.fixture(scope="module")
def expected(hybrid: tuple[Any, Path]) -> dict[tuple[int, ...], tuple[list[int], list[float]]]:
    hf, _ = hybrid
    prompts = [FIRST, SECOND, *ASKS, *PROMPTS, SLOW, AFTER, REPEAT]
    return {tuple(p): hf_greedy_gaps(hf, p, NEW_TOKENS) for p in prompts}


def engine_of(path: Path, **kw: Any) -> LLMEngine:
    values: dict[str, Any] = {
        "model_dir": path, "dtype": "float32", "block_size": 4, "num_kv_blocks": 128,
        "max_num_batched_tokens": 16, "attention_backend": "torch",
    }  # fmt: skip
    return LLMEngine(EngineConfig(**values | kw))


def generate(engine: LLMEngine, prompts: list[list[int]]) -> list[tuple[list[int], int]]:
    """Each prompt's greedy tokens and cached tokens, all in the engine at once."""
    ids = [f"r{engine.counters.finished_requests + i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, PARAMS)
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    cached: dict[str, int] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            cached[out.request_id] = out.num_cached_tokens
    return [(tokens[rid], cached[rid]) for rid in ids]


def check(expected: dict[tuple[int, ...], Any], prompt: list[int], tokens: list[int]) -> None:
    want, gaps = expected[tuple(prompt)]
    assert_greedy_near(tokens, want, gaps, TIE)


def book(engine: LLMEngine) -> StateCheckpoints:
    assert engine.runner.hybrid is not None and engine.runner.hybrid.checkpoints is not None
    return engine.runner.hybrid.checkpoints


def assert_idle(engine: LLMEngine) -> None:
    """Every block and state slot back, the block accounting whole, no save pending."""
    stats = engine.stats()
    assert stats.free_blocks == stats.total_blocks
    assert stats.free_state_slots == stats.total_state_slots > 0
    engine.scheduler.audit()
    hybrid = engine.runner.hybrid
    assert hybrid is not None
    assert hybrid.checkpoints is None or hybrid.checkpoints.num_pending == 0


@pytest.mark.parametrize("budget", [16, 5], ids=["whole", "chunked"])
@pytest.mark.parametrize("path_name", list(PATHS))
def test_a_repeated_prefix_resumes_from_its_checkpoint(
    hybrid: tuple[Any, Path], expected: dict[tuple[int, ...], Any], path_name: str, budget: int
) -> None:
    """The first prompt saves its state at 16 (mid-chunk with 5 tokens a step); the second
    resumes there: 16 tokens cached, only the rest computed, transformers' tokens."""
    if path_name == "triton":
        pytest.importorskip("triton")
    engine = engine_of(hybrid[1], **PATHS[path_name] | {"max_num_batched_tokens": budget})
    [(first, none)] = generate(engine, [FIRST])
    computed = engine.counters.tokens_computed
    [(second, cached)] = generate(engine, [SECOND])
    assert (none, cached) == (0, 16)
    assert engine.counters.tokens_computed - computed == len(SECOND) - 16 + NEW_TOKENS - 1
    assert engine.counters.state_checkpoint_hits == 1
    assert engine.counters.prefix_hit_tokens == 16
    check(expected, FIRST, first)
    check(expected, SECOND, second)
    assert_idle(engine)


def test_chunks_of_one_token_save_and_resume(
    hybrid: tuple[Any, Path], expected: dict[tuple[int, ...], Any]
) -> None:
    """A chunk of one token runs with the decodes (one token each): it too saves the state
    after its token and starts from a checkpoint."""
    engine = engine_of(hybrid[1], max_num_batched_tokens=4)
    *_, (slow, none) = generate(engine, [[7], [8], [9], SLOW])
    [(after, hit)] = generate(engine, [AFTER])
    [(repeat, again)] = generate(engine, [REPEAT])
    assert (none, hit, again) == (0, 8, 8)
    for prompt, tokens in ((SLOW, slow), (AFTER, after), (REPEAT, repeat)):
        check(expected, prompt, tokens)
    assert_idle(engine)


def test_prompts_sharing_a_system_prompt_hit_from_the_third_on(
    hybrid: tuple[Any, Path], expected: dict[tuple[int, ...], Any]
) -> None:
    """The first prompt's checkpoint lies past the shared part; the second matches the
    shared blocks but finds none at their end, so it computes whole and saves one there;
    the third resumes from it."""
    engine = engine_of(hybrid[1])
    runs = [generate(engine, [ask])[0] for ask in ASKS]
    assert [cached for _, cached in runs] == [0, 0, len(SYSTEM)]
    for ask, (tokens, _) in zip(ASKS, runs, strict=True):
        check(expected, ask, tokens)
    assert_idle(engine)


@pytest.mark.parametrize("checkpoints", [0, 1], ids=["none-kept", "evicted"])
def test_without_a_checkpoint_there_is_no_hit(
    hybrid: tuple[Any, Path], expected: dict[tuple[int, ...], Any], checkpoints: int
) -> None:
    """With no checkpoints kept the prefix cache is off; with one, an unrelated prompt's
    takes its place and the shared blocks have none at their end: the second prompt is
    computed whole, its tokens still transformers'."""
    engine = engine_of(hybrid[1], linear_state_checkpoints=checkpoints)
    assert engine.config.enable_prefix_caching == bool(checkpoints)
    runs = [generate(engine, [p])[0] for p in (FIRST, PROMPTS[1], SECOND)]
    assert [cached for _, cached in runs] == [0, 0, 0]
    for prompt, (tokens, _) in zip((FIRST, PROMPTS[1], SECOND), runs, strict=True):
        check(expected, prompt, tokens)
    assert engine.counters.state_checkpoint_hits == 0
    assert (engine.counters.state_checkpoint_evictions > 0) == bool(checkpoints)
    assert_idle(engine)


def test_two_tensor_parallel_ranks_resume_from_their_shares(
    hybrid: tuple[Any, Path], expected: dict[tuple[int, ...], Any]
) -> None:
    """Each rank saves and reads its key heads' share of the checkpoint under rank 0's slot
    numbers."""
    engine = engine_of(hybrid[1], tensor_parallel_size=2, max_num_batched_tokens=5)
    try:
        runs = [generate(engine, [p])[0] for p in (FIRST, SECOND)]
        assert [cached for _, cached in runs] == [0, 16]
        for prompt, (tokens, _) in zip((FIRST, SECOND), runs, strict=True):
            check(expected, prompt, tokens)
        assert_idle(engine)
    finally:
        engine.close()


@pytest.mark.parametrize("swap_room", [None, 8], ids=["recompute", "swap"])
def test_preempted_requests_with_hits_resume_with_the_same_tokens(
    hybrid: tuple[Any, Path], expected: dict[tuple[int, ...], Any], swap_room: int | None
) -> None:
    """Too few blocks for three prompts at once, the first of them resuming from a
    checkpoint: requests are preempted (recomputed, their hit found again, or swapped with
    their states) and every token is still transformers'."""
    tier = {"kv_offload_cpu_gb": gib(64)} if swap_room is not None else {}
    engine = engine_of(hybrid[1], num_kv_blocks=12, **tier)
    rule = engine.stepper.swap
    if rule is not None:
        engine.stepper.swap = None  # the rates stay as set: swapping is the cheaper
        rule.copy_bytes_per_s, rule.prefill_tokens_per_s = 1e12, 1.0
    generate(engine, [FIRST])
    prompts = [SECOND, PROMPTS[0], PROMPTS[1]]
    runs = generate(engine, prompts)
    assert runs[0][1] == 16 and engine.counters.preemptions > 0
    assert (engine.counters.preemptions_swap > 0) == (swap_room is not None)
    for prompt, (tokens, _) in zip(prompts, runs, strict=True):
        check(expected, prompt, tokens)
    assert_idle(engine)
    engine.close()


def test_an_abort_after_a_hit_and_a_failed_step_leave_nothing_held(
    hybrid: tuple[Any, Path],
) -> None:
    engine = engine_of(hybrid[1], max_num_batched_tokens=4)
    generate(engine, [FIRST])
    engine.add_request("hit", SECOND, PARAMS)
    engine.step()  # resumed at 16: its first chunk of 4 (holds a slot, saves at 20)
    assert engine.scheduler.get("hit").num_cached_tokens == 16  # type: ignore[union-attr]
    assert engine.abort("hit")
    assert_idle(engine)
    used = book(engine).num_used

    def fail(*_: Any) -> Any:
        raise RuntimeError("the forward failed")

    engine.runner.forward = fail  # type: ignore[method-assign]
    engine.add_request("lost", PROMPTS[1][:5], PARAMS)  # its first chunk would save at 4
    with pytest.raises(RuntimeError, match="the forward failed"):
        engine.step()
    assert book(engine).num_pending == 1
    assert engine.abort("lost")  # as the engine loop does with a failed step's requests
    assert book(engine).num_used == used
    assert_idle(engine)


def test_the_prefill_role_ships_the_state_after_a_hit(
    hybrid: tuple[Any, Path], expected: dict[tuple[int, ...], Any]
) -> None:
    """A prefill node resumes the second prompt from its checkpoint and parks the state the
    prefill left; a decode node reads it with the blocks and continues as transformers."""
    path = hybrid[1]
    prefill = engine_of(path, role="prefill", max_num_batched_tokens=8)
    for rid, prompt in (("a", FIRST), ("b", SECOND)):
        prefill.add_request(rid, prompt, PARAMS)
        [out] = [o for o in _until_done(prefill)]
        first = list(out.new_token_ids)
    assert out.num_cached_tokens == 16 and prefill.release("a")
    decode = engine_of(path, role="decode", max_num_batched_tokens=8)
    plan = decode.import_request("b", SECOND, first, PARAMS)
    assert plan is not None
    remote, local = transfer_pairs(plan, prefill.pinned_blocks("b"))
    for src, dst in zip(remote, local, strict=True):
        decode.runner.kv_cache[dst] = prefill.runner.kv_cache[src]
    assert decode.load_imported_state("b") is None
    decode.commit_import("b")
    tokens = first + [t for o in _until_done(decode) for t in o.new_token_ids]
    check(expected, SECOND, tokens)
    assert prefill.release("b")
    assert_idle(prefill)
    assert_idle(decode)


def _until_done(engine: LLMEngine) -> list[Any]:
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    return outs


def test_a_negative_number_of_checkpoints_is_refused_by_name(hybrid: tuple[Any, Path]) -> None:
    with pytest.raises(ValueError, match="linear_state_checkpoints must be >= 0, got -1"):
        engine_of(hybrid[1], linear_state_checkpoints=-1)
