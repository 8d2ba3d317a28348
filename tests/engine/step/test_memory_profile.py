"""The profiling forward that sizes the KV cache on a GPU runs the largest step the scheduler
may build. The memory readings themselves need CUDA (test at the end, skipped without)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_llama import make_runner, save_tiny_llama, step

from engine.kv.sizing import GIB
from engine.scheduler.plan import ScheduledChunk
from engine.step.memory_profile import (
    BatchShape,
    measure_device_memory,
    profile_batch,
    profile_forward,
    profile_lengths,
    profile_sampling,
)


@pytest.mark.parametrize(
    ("tokens", "seqs", "max_len", "lengths"),
    [
        (2048, 256, 4096, [8] * 256),  # the CUDA defaults: every sequence sampled
        (2048, 3, 4096, [683, 683, 682]),
        (2048, 1, 512, [512]),  # no sequence longer than the context
        (10, 256, 100, [1] * 10),  # never more sequences than tokens
    ],
)
def test_the_largest_step(tokens: int, seqs: int, max_len: int, lengths: list[int]) -> None:
    assert profile_lengths(tokens, seqs, max_len) == lengths


def test_profile_forward_is_the_runners_forward(tmp_path: Path) -> None:
    """Same logits as the runner gives for those prompts, from a scratch cache of its own."""
    save_tiny_llama(tmp_path)
    runner = make_runner(tmp_path)
    lengths = profile_lengths(23, 3, runner.max_model_len)
    before = runner.kv_cache.clone()
    logits = profile_forward(runner.model, runner.layout, lengths, runner.device)
    assert torch.equal(runner.kv_cache, before)  # the real cache is untouched
    assert logits.shape == (3, runner.model_config.vocab_size)
    first = 0
    chunks = []
    for i, n in enumerate(lengths):
        table = tuple(range(first, first + -(-n // runner.layout.block_size)))
        chunks.append(ScheduledChunk(f"r{i}", (0,) * n, 0, table, True))
        first += len(table)
    torch.testing.assert_close(logits.float(), step(runner, *chunks), atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_measured_on_the_gpu(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    runner = make_runner(tmp_path, device="cuda")
    vocab = runner.model_config.vocab_size
    bare = measure_device_memory(
        runner.model, runner.layout, [128] * 4, runner.device, BatchShape(1, 1, vocab)
    )
    assert 0 < bare.weights < GIB and 0 < bare.activation_peak < GIB
    assert bare.free < bare.total
    full = measure_device_memory(
        runner.model, runner.layout, [128] * 4, runner.device, BatchShape(256, 64, vocab)
    )
    # the penalty tables of 256 rows (int32 counts and bool prompt marks) are in the peak
    assert full.activation_peak >= bare.activation_peak + 256 * vocab * 5


def test_profile_sampling_runs_the_costliest_settings(tmp_path: Path) -> None:
    """Every row of the profiling batch samples with penalties, a full top-p sort and
    logprobs, from the profile's logits repeated to the batch's rows."""
    save_tiny_llama(tmp_path)
    runner = make_runner(tmp_path)
    vocab = runner.model_config.vocab_size
    batch = profile_batch(BatchShape(7, 4, vocab), runner.layout.block_size, runner.device)
    step_rows = batch.sampling.gather(list(range(7)), torch.arange(7))
    assert step_rows.penalties is not None and step_rows.penalties.prompt_seen is not None
    assert step_rows.any_top_k_top_p and step_rows.any_min_p and step_rows.logprobs == (20,) * 7
    logits = profile_forward(runner.model, runner.layout, [5, 3], runner.device)
    tokens = profile_sampling(logits, batch)
    assert tokens.shape == (7,) and bool(((tokens >= 0) & (tokens < vocab)).all())
