"""A hybrid model (Qwen3-Next) prefilled on one engine and decoded on another: the prefill
role parks each request's linear-attention state in KV blocks at the end of its leased
table, the decode role reads them with the prompt's blocks (the pairs the importer moves)
into a state slot, every rank its share (between engines of different TP too). The tokens
equal a colocated engine's; a corrupt, foreign or missing
state record is refused (to be recomputed), never decoded; nothing leaks on either side."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from decode_node.importer import transfer_pairs
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.scheduler.plan import ImportPlan
from models.sampling_params import SamplingParams
from tests.engine.model.test_families import PROMPTS
from tests.engine.model.tiny_families import assert_greedy_near, hf_greedy_gaps, save_family

PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
TIE = 1e-3  # logits of the top two tokens closer than this may swap with summation order
Tamper = Callable[[LLMEngine, ImportPlan], None]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    path = tmp_path_factory.mktemp("qwen3_next")
    return save_family("qwen3_next", path), path


@pytest.fixture(scope="module")
def model_dir(hybrid: tuple[Any, Path]) -> Path:
    return hybrid[1]


def engine(path: Path, **kw: Any) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model_dir=path, dtype="float32", block_size=4, num_kv_blocks=64,
            max_num_batched_tokens=8, attention_backend="torch", **kw,
        )
    )  # fmt: skip


def run(engine: LLMEngine) -> list[int]:
    tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
    return tokens


def assert_idle(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats.free_blocks == stats.total_blocks
    assert stats.free_state_slots == stats.total_state_slots


def handoff(
    path: Path, prompt: list[int], decode_id: str = "a", tamper: Tamper | None = None
) -> tuple[LLMEngine, LLMEngine, list[int], str | None]:
    """Prefill ``prompt`` as request "a", move the blocks the importer would into a decode
    engine's import of ``decode_id``; (prefill, decode, token 1, the state's refusal)."""
    prefill = engine(path, role="prefill")
    prefill.add_request("a", prompt, PARAMS)
    first = run(prefill)
    decode = engine(path, role="decode")
    plan = decode.import_request(decode_id, prompt, first, PARAMS)
    assert plan is not None and plan.num_state_blocks == decode.runner.state_blocks > 0
    remote, local = transfer_pairs(plan, prefill.pinned_blocks("a"))
    for src, dst in zip(remote, local, strict=True):
        decode.runner.kv_cache[dst] = prefill.runner.kv_cache[src]
    if tamper is not None:
        tamper(decode, plan)
    return prefill, decode, first, decode.load_imported_state(decode_id)


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_the_decode_node_continues_from_the_shipped_state(
    model_dir: Path, prompt: list[int]
) -> None:
    colocated = engine(model_dir)
    colocated.add_request("a", prompt, PARAMS)
    want = run(colocated)
    prefill, decode, first, why = handoff(model_dir, prompt)
    assert why is None
    n = prefill.runner.state_blocks
    assert len(prefill.pinned_blocks("a")) >= -(-len(prompt) // 4) + n  # leased with the KV
    assert prefill.stats().free_state_slots == prefill.stats().total_state_slots
    decode.commit_import("a")
    assert first + run(decode) == want
    assert prefill.release("a")
    assert_idle(prefill)
    assert_idle(decode)


def rank_caches(engine: LLMEngine) -> list[torch.Tensor]:
    """Every rank's KV cache (rank 0's first), the memory the ranks write."""
    others = engine.ranks.kv_caches() if engine.ranks is not None else []
    return [engine.runner.kv_cache, *others]


@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(2, 1), (1, 2)])
def test_the_state_moves_between_pools_of_different_tp(
    hybrid: tuple[Any, Path], prefill_tp: int, decode_tp: int
) -> None:
    """Each rank's share of the state rides in the cells of its KV head; moved head by head
    between a prefill engine of one TP and a decode engine of another (as the transfer plan
    moves them), the decode engine's every rank reads its share, and the tokens are
    transformers' (up to a near tie: the ranks sum in another order)."""
    hf, model_dir = hybrid
    prompt = PROMPTS[1]
    want, gaps = hf_greedy_gaps(hf, prompt, PARAMS.max_tokens)
    prefill = engine(model_dir, role="prefill", tensor_parallel_size=prefill_tp)
    try:
        prefill.add_request("a", prompt, PARAMS)
        first = run(prefill)
        pinned = prefill.pinned_blocks("a")
        whole = [torch.cat(rank_caches(prefill), dim=4)[b].clone() for b in pinned]
        assert prefill.release("a")
        assert_idle(prefill)
    finally:
        prefill.close()
    decode = engine(model_dir, role="decode", tensor_parallel_size=decode_tp)
    try:
        plan = decode.import_request("a", prompt, first, PARAMS)
        assert plan is not None
        remote, local = transfer_pairs(plan, list(range(len(whole))))
        caches, start = rank_caches(decode), 0
        for cache in caches:
            heads = cache.shape[4]
            for src, dst in zip(remote, local, strict=True):
                cache[dst] = whole[src][:, :, :, start : start + heads]
            start += heads
        assert decode.load_imported_state("a") is None
        decode.commit_import("a")
        assert_greedy_near(first + run(decode), want, gaps, TIE)
        assert_idle(decode)
    finally:
        decode.close()


def _flip_payload_byte(decode: LLMEngine, plan: ImportPlan) -> None:
    block = decode.runner.kv_cache[plan.block_ids[-1]].view(-1)
    block[0] += 1.0  # the record's tail block: payload, never the header


def _wipe_record(decode: LLMEngine, plan: ImportPlan) -> None:
    for block in plan.block_ids[-plan.num_state_blocks :]:
        decode.runner.kv_cache[block] = 0


@pytest.mark.parametrize(
    ("decode_id", "tamper", "named"),
    [
        ("a", _flip_payload_byte, "corrupt"),
        ("b", None, "another request's state"),
        ("a", _wipe_record, "no state record"),
    ],
    ids=["corrupt", "foreign", "missing"],
)
def test_a_bad_state_record_is_refused_and_nothing_leaks(
    model_dir: Path, decode_id: str, tamper: Tamper | None, named: str
) -> None:
    prefill, decode, _, why = handoff(model_dir, PROMPTS[0], decode_id, tamper)
    assert why is not None and named in why
    assert decode.abort(decode_id)  # the node then recomputes the prompt
    assert_idle(decode)
    assert prefill.release("a")
    assert_idle(prefill)
