"""A model whose every layer has a sliding window gives a decoding request's blocks behind
the window back to the pool, and its tokens stay transformers' (Mistral-style window 7,
blocks of 4: a request holds a few blocks however long it runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.admission import release_window
from engine.config import EngineConfig, Role
from engine.engine import LLMEngine
from engine.model.config import ModelConfig
from models.sampling_params import SamplingParams
from tests.engine.model.tiny_families import WINDOW, hf_greedy, save_family

BLOCK, NUM_BLOCKS, NEW_TOKENS = 4, 40, 40
PROMPTS = [[1, *range(20, 33)], [1, *range(60, 69)]]  # 14 and 10 tokens


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    path = tmp_path_factory.mktemp("mistral")
    return save_family("mistral", path), path


def test_blocks_behind_the_window_go_back(mistral: tuple[Any, Path]) -> None:
    hf, path = mistral
    engine = LLMEngine(EngineConfig(model_dir=path, block_size=BLOCK, num_kv_blocks=NUM_BLOCKS))
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    tokens: dict[str, list[int]] = {"0": [], "1": []}
    most_owned = 0
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
        engine.scheduler.audit()  # placeholders are not owned: ref counts add up
        owned = [len(r.owned_block_ids) for r in engine.scheduler.running]
        most_owned = max([most_owned, *owned])
    # a request sees WINDOW keys: at most 3 blocks of 4, plus the one being filled
    assert most_owned <= -(-WINDOW // BLOCK) + 2
    # without the release each would end with ceil((prompt + 40) / 4) = 14 blocks
    assert engine.stats().free_blocks == NUM_BLOCKS  # all back (free or evictable)
    for i, prompt in enumerate(PROMPTS):
        assert tokens[str(i)] == hf_greedy(hf, prompt, NEW_TOKENS)


def test_pool_smaller_than_the_requests_without_the_window_suffices(
    mistral: tuple[Any, Path],
) -> None:
    """16 blocks: two requests of 54 and 50 tokens (14 and 13 blocks) run side by side to
    the end without a preemption, because each holds only its window's blocks."""
    hf, path = mistral
    engine = LLMEngine(EngineConfig(model_dir=path, block_size=BLOCK, num_kv_blocks=16))
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    tokens: dict[str, list[int]] = {"0": [], "1": []}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    assert engine.counters.preemptions == 0
    assert [tokens["0"], tokens["1"]] == [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]


def test_no_release_where_blocks_must_stay_whole(mistral: tuple[Any, Path]) -> None:
    _, path = mistral
    model = ModelConfig.from_dir(path)
    assert release_window(EngineConfig(model_dir=path), model) == WINDOW
    assert release_window(EngineConfig(model_dir=path, role=Role.PREFILL), model) == 0
