"""logit_bias through the engine: -100 keeps a token out of greedy output on both the
overlapped and the synchronous path; a bias on a token id outside the vocabulary is refused."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from tiny_llama import save_tiny_llama

from engine.config import EngineConfig
from engine.engine import LLMEngine
from models.sampling_params import SamplingParams

PROMPTS = [[(7 * i + 11 * j) % 120 + 3 for j in range(6 + i)] for i in range(4)]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bias")
    save_tiny_llama(path)
    return path


def _generate(tiny_dir: Path, params: SamplingParams, overlap: bool) -> list[list[int]]:
    engine = LLMEngine(
        EngineConfig(model_dir=tiny_dir, block_size=4, num_kv_blocks=64, async_scheduling=overlap)
    )
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(PROMPTS))}
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, params)
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    assert engine.stats().free_blocks == engine.stats().total_blocks
    return list(tokens.values())


@pytest.mark.parametrize("overlap", [False, True])
def test_a_minus_100_bias_keeps_the_favourite_token_out(tiny_dir: Path, overlap: bool) -> None:
    plain = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    before = _generate(tiny_dir, plain, overlap)
    favourite, _ = Counter(t for seq in before for t in seq).most_common(1)[0]
    banned = SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, logit_bias=((favourite, -100.0),)
    )
    after = _generate(tiny_dir, banned, overlap)
    assert all(favourite not in seq for seq in after)
    assert after != before


def test_a_bias_outside_the_vocabulary_is_refused(tiny_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model_dir=tiny_dir, block_size=4, num_kv_blocks=16))
    vocab = engine.model_config.vocab_size
    with pytest.raises(ValueError, match="logit_bias"):
        engine.add_request("r", [3, 4], SamplingParams(logit_bias=((vocab, 1.0),)))
    assert not engine.has_unfinished()
