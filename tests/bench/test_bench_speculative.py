"""bench.speculative counts decode throughput at the batch size it names (run here with the
tiny random Llama)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_llama import save_tiny_llama

from bench.speculative import compare, random_prompts, run


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bench_speculative")
    save_tiny_llama(path)
    return path


def test_full_batch_steps_emit_one_token_per_slot_without_speculation(tiny_dir: Path) -> None:
    prompts = random_prompts(6, 20, 128, seed=1)
    result = run(tiny_dir, prompts, 12, True, 2)
    # 6 requests of 12 tokens through 2 slots: 3 waves of 11 decode steps at batch 2 (the
    # first token of each comes with its prefill, outside the count)
    assert result["full_batch_steps"] == 33
    assert result["decode_tokens"] == 2 * result["full_batch_steps"]
    assert sum(map(len, result["tokens"])) == 6 * 12


def test_speculative_rows_count_every_emitted_token_and_match_plain(tiny_dir: Path) -> None:
    row = compare(tiny_dir, "random", 2, 16, {"speculative_method": "ngram"}, 3, 128, rounds=2)
    assert row["greedy_outputs_identical"]
    assert row["requests"] == 4
    assert row["accepted"] > 0  # the tiny model loops: prompt lookup guesses hold
    # every slot of a full-batch step emits at least one token, a speculative chunk more
    assert row["decode_tokens"] >= 2 * row["full_batch_steps"]["speculative"] > 0
