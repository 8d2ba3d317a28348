"""Pipeline-parallel engines on the CPU (gloo, 2 stages, and 2 x 2 ranks with tensor
parallelism): the tokens of one stage and of transformers, micro-batches in flight, each
stage's waiting reported, and stages that never outlive a failure."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from engine_driver import drive
from tiny_llama import save_tiny_llama

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.parallel import RankFailed
from models.sampling_params import SamplingParams
from tests.engine.model.tiny_families import hf_greedy, save_family

PROMPTS = [
    [1, 5, 9, 33, 7, 100, 3, 17, 64, 12, 80, 41, 6, 22, 90, 3, 15, 8],
    [1, 44, 12, 90],
    [1, 2, 3, 4, 5, 6, 7],
]
NEW_TOKENS = 10
DEADLINE_S = 60.0


def _config(model_dir: Path, tp: int = 1, pp: int = 1) -> EngineConfig:
    return EngineConfig(
        model_dir=model_dir, tensor_parallel_size=tp, pipeline_parallel_size=pp, num_kv_blocks=32
    )


def _params(tokens: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize(
    ("model", "tp"),
    [
        ("llama", 1),  # 3 layers: 1 on the first stage, 2 and the tied head on the last
        ("qwen2_moe", 1),  # 3 layers of experts, an untied head
        ("llama", 2),  # 2 stages of 2 tensor-parallel ranks: 4 processes
    ],
)
def test_two_stages_give_the_tokens_of_one_and_of_transformers(
    tmp_path: Path, model: str, tp: int
) -> None:
    if model == "llama":
        hf = save_tiny_llama(tmp_path, num_hidden_layers=3)
    else:
        hf = save_family(model, tmp_path, num_hidden_layers=3)
    want = {f"r{i}": hf_greedy(hf, p, NEW_TOKENS) for i, p in enumerate(PROMPTS)}
    work = [(f"r{i}", p, _params()) for i, p in enumerate(PROMPTS)]
    for size in (1, 2):
        engine = LLMEngine(_config(tmp_path, tp if size == 2 else 1, size))
        try:
            tokens = drive(engine, work, {})["tokens"]
            assert tokens == want, f"pipeline_parallel_size {size}"
            assert engine.block_manager.num_free_blocks == engine.runner.num_blocks  # no leak
            if size == 2:
                assert engine.ranks is not None
                _check_stage_times(engine)
        finally:
            engine.close()


def _check_stage_times(engine: LLMEngine) -> None:
    assert engine.ranks is not None
    times = engine.ranks.stage_times()
    assert [t.stage for t in times] == [0, 1]
    for t in times:
        # every decode step of 3 rows ran as 2 micro-batches
        assert t.steps >= NEW_TOKENS - 1 and t.micro_batches >= 2 * (NEW_TOKENS - 2)
        assert 0 < t.busy_s < t.wall_s and 0 < t.wait_s < t.wall_s
        assert 0.0 < t.bubble < 1.0


def test_a_killed_stage_fails_the_engine_and_leaves_no_process(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    engine = LLMEngine(_config(tmp_path, pp=2))
    ranks = engine.ranks
    assert ranks is not None
    told = threading.Event()
    ranks.on_failure.append(lambda message: told.set())
    engine.add_request("a", PROMPTS[0], _params(50))
    engine.step()
    (pid,) = ranks.pids
    os.kill(pid, signal.SIGKILL)
    assert told.wait(DEADLINE_S)  # noticed while idle, before any step
    named = rf"stage 1 \(tensor-parallel rank 0\): rank 1 \(pid {pid}\) exited with code -9"
    with pytest.raises(RankFailed, match=named):
        for _ in range(5):  # the step in flight (overlapped scheduling) may come out first
            engine.step()
    engine.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_pipeline_stages_refuse_what_they_do_not_go_with(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    with pytest.raises(ValueError, match=r"pipeline_parallel_size=2 does not go with specul"):
        EngineConfig(model_dir=tmp_path, pipeline_parallel_size=2, speculative_method="ngram")
    with pytest.raises(ValueError, match=r"pipeline_parallel_size \(3\) is above the model's 2"):
        LLMEngine(_config(tmp_path, pp=3))
