"""Overlapped scheduling gives the synchronous engine's tokens, on a workload that has it all:
prefix hits, preemption, aborts, EOS and stop ids seen one step late, seeded sampling with
penalties, logprobs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from engine_driver import drive
from tiny_llama import save_tiny_llama

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.scheduler.request import FinishReason
from models.sampling_params import SamplingParams

SHARED = [(5 * i + 3) % 120 + 3 for i in range(24)]  # six full blocks of 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("overlap")
    save_tiny_llama(path)
    return path


def _workload() -> list[tuple[str, list[int], SamplingParams]]:
    kinds: list[dict[str, Any]] = [
        {"temperature": 0.0},
        {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "seed": 7},
        {"temperature": 1.2, "min_p": 0.05, "seed": 11, "frequency_penalty": 0.5},
        {"temperature": 0.0, "repetition_penalty": 1.3, "presence_penalty": 0.4, "logprobs": 3},
        {"temperature": 1.0, "seed": 3, "stop_token_ids": (9, 17, 33)},
    ]
    work = []
    for i in range(14):
        prompt = (SHARED if i % 2 else []) + [(7 * i + 11 * j) % 125 + 3 for j in range(5 + 3 * i)]
        params = SamplingParams(max_tokens=10 + 3 * (i % 5), **kinds[i % len(kinds)])
        work.append((f"r{i}", prompt, params))
    return work


ABORT_AFTER = {"r4": 3, "r9": 1}  # request -> tokens seen before the client aborts it


def _run(tiny_dir: Path, overlap: bool) -> tuple[dict[str, Any], LLMEngine]:
    engine = LLMEngine(
        EngineConfig(
            model_dir=tiny_dir,
            block_size=4,
            num_kv_blocks=40,  # too few for all at once: preemption
            max_num_seqs=8,
            max_num_batched_tokens=48,
            async_scheduling=overlap,
        )
    )
    return drive(engine, _workload(), ABORT_AFTER), engine


def test_overlapped_engine_gives_the_synchronous_tokens(tiny_dir: Path) -> None:
    sync, sync_engine = _run(tiny_dir, overlap=False)
    overlapped, engine = _run(tiny_dir, overlap=True)
    assert overlapped["tokens"] == sync["tokens"]
    assert overlapped["reasons"] == sync["reasons"]
    for rid, lps in sync["logprobs"].items():
        assert [lp.token_id for lp in lps] == [lp.token_id for lp in overlapped["logprobs"][rid]]
        for a, b in zip(lps, overlapped["logprobs"][rid], strict=True):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
    # the workload did what it is for, in both engines
    reasons = list(sync["reasons"].values())
    assert reasons.count(FinishReason.ABORT) == 2 and FinishReason.STOP in reasons
    assert FinishReason.LENGTH in reasons and len(reasons) == 14
    for e in (sync_engine, engine):
        assert e.counters.preemptions > 0
        assert e.block_manager.num_prefix_hit_tokens > 0
        assert e.stats().free_blocks == e.stats().total_blocks
        assert e.runner.batch.num_rows == 0
    # overlapped: the first step's tokens come out one call later, and no extra sync path
    assert engine.counters.steps >= sync_engine.counters.steps


@pytest.mark.parametrize(("asked", "overlapped"), [(None, False), (True, True), (False, False)])
def test_on_the_cpu_a_prefill_hands_out_its_token_unless_overlap_is_asked(
    tiny_dir: Path, asked: bool | None, overlapped: bool
) -> None:
    """The CPU forward runs in the engine's thread: by default the step that computed the
    first token returns it (time to first token), and overlap is there only when asked."""
    config = EngineConfig(model_dir=tiny_dir, block_size=4, num_kv_blocks=16)
    engine = LLMEngine(dataclasses.replace(config, async_scheduling=asked))
    engine.add_request("a", [5, 6, 7, 8, 9], SamplingParams(max_tokens=3, temperature=0.0))
    first = engine.step()
    assert [o.request_id for o in first] == ([] if overlapped else ["a"])
    assert engine.stepper.overlap is overlapped
