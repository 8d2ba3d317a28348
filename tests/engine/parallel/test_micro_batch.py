"""A step cut into micro-batches computes what the whole step does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_llama import save_tiny_llama

from engine.config import EngineConfig
from engine.model.attention import AttentionMetadata
from engine.model.config import ModelConfig
from engine.parallel.micro_batch import cut_points, split_step
from engine.step.batch import StepInputs
from engine.step.model_load import load_model


@pytest.mark.parametrize(
    ("query_lens", "parts", "cuts"),
    [
        ((1, 1, 1, 1, 1), 2, [0, 3, 5]),  # decodes: halves
        ((1, 1, 1, 1), 2, [0, 2, 4]),
        ((1, 1, 8), 2, [0, 2, 3]),  # the prefill chunk alone
        ((9, 1), 2, [0, 1, 2]),  # every run keeps a sequence
        ((5,), 2, [0, 1]),  # one sequence: one micro-batch
        ((1, 1), 4, [0, 1, 2]),  # never more runs than sequences
        ((1, 1, 1, 1, 1, 1), 3, [0, 2, 4, 6]),
    ],
)
def test_cut_points_balance_tokens_over_whole_sequences(
    query_lens: tuple[int, ...], parts: int, cuts: list[int]
) -> None:
    assert cut_points(query_lens, parts) == cuts


def test_micro_batches_give_the_step_s_logits_and_cache(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    config = EngineConfig(model_dir=tmp_path, num_kv_blocks=16, block_size=4)
    loaded = load_model(config, ModelConfig.from_dir(tmp_path))
    # three decodes (contexts of 6, 9, 3 tokens) then two prefill chunks, one not sampled
    query_lens, starts = [1, 1, 1, 5, 3], [5, 8, 2, 4, 0]
    tables = [[0, 1], [2, 3, 4], [5], [6, 7, 8], [9]]
    meta = AttentionMetadata.build(query_lens, starts, tables, 4)
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 128, (meta.num_tokens,), generator=gen)
    sampled = torch.tensor([0, 1, 2, 7])  # the decodes and the first chunk's last token
    step = StepInputs(input_ids, meta, sampled, None)
    cache = torch.randn(loaded.layout.cache_shape(16), generator=gen)  # earlier tokens' K/V
    whole_cache, split_cache = cache.clone(), cache.clone()
    whole = loaded.model(input_ids, meta, whole_cache, sampled)
    parts = split_step(step, 2)
    assert [p.meta.query_lens for p in parts] == [(1, 1, 1, 5), (3,)]
    assert [p.meta.num_decodes for p in parts] == [3, 0]
    logits = [loaded.model(p.input_ids, p.meta, split_cache, p.logits_indices) for p in parts]
    torch.testing.assert_close(torch.cat(logits), whole)
    torch.testing.assert_close(split_cache, whole_cache)
