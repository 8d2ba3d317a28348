"""Tensor-parallel engines on the CPU (gloo, 2 ranks): the same greedy tokens as one rank
and as transformers, and ranks that never outlive their engine."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from engine_driver import drive
from tiny_llama import save_tiny_llama

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.parallel import RankFailed
from models.sampling_params import SamplingParams
from tests.engine.model.tiny_families import hf_greedy, save_family

PROMPTS = [[1, 5, 9, 33, 7, 100, 3, 17, 64, 12, 80, 41, 6, 22, 90, 3, 15, 8], [1, 44, 12, 90]]
NEW_TOKENS = 10
DEADLINE_S = 60.0


def _greedy(model_dir: Path, tp: int) -> dict[str, list[int]]:
    engine = LLMEngine(EngineConfig(model_dir=model_dir, tensor_parallel_size=tp, num_kv_blocks=32))
    try:
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        work = [(f"r{i}", p, params) for i, p in enumerate(PROMPTS)]
        tokens: dict[str, list[int]] = drive(engine, work, {})["tokens"]
        assert engine.block_manager.num_free_blocks == engine.runner.num_blocks  # no leak
        return tokens
    finally:
        engine.close()


@pytest.mark.parametrize(
    "model",
    [
        "llama",  # 4 heads over 2 KV heads: one KV head per rank
        "llama_one_kv_head",  # the KV head replicated, 2 query heads per rank
        "qwen2_moe",  # 3 experts per rank, the shared expert and the MLP split by rows
        "deepseek_v3",  # 2 query heads per rank over the whole latent, 4 experts per rank
        "gpt_oss",  # 2 query heads per rank with their sinks, 2 experts per rank with biases
    ],
)
def test_two_ranks_give_the_tokens_of_one_and_of_transformers(tmp_path: Path, model: str) -> None:
    if model in ("qwen2_moe", "deepseek_v3", "gpt_oss"):
        hf = save_family(model, tmp_path)
    else:
        kv = 1 if model == "llama_one_kv_head" else 2
        hf = save_tiny_llama(tmp_path, num_key_value_heads=kv)
    want = {f"r{i}": hf_greedy(hf, p, NEW_TOKENS) for i, p in enumerate(PROMPTS)}
    assert _greedy(tmp_path, 1) == want
    assert _greedy(tmp_path, 2) == want


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_killed_rank_fails_the_engine_and_leaves_no_process(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    engine = LLMEngine(EngineConfig(model_dir=tmp_path, tensor_parallel_size=2, num_kv_blocks=32))
    ranks = engine.ranks
    assert ranks is not None
    told = threading.Event()
    ranks.on_failure.append(lambda message: told.set())
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    engine.add_request("a", PROMPTS[0], params)
    engine.step()
    (pid,) = ranks.pids
    os.kill(pid, signal.SIGKILL)
    assert told.wait(DEADLINE_S)  # noticed while idle, before any step
    with pytest.raises(RankFailed, match=rf"rank 1 \(pid {pid}\) exited with code -9"):
        for _ in range(5):  # the step in flight (overlapped scheduling) may come out first
            engine.step()
    engine.close()
    assert _gone(pid)


def test_ranks_exit_with_their_engine(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    engine = LLMEngine(EngineConfig(model_dir=tmp_path, tensor_parallel_size=2, num_kv_blocks=32))
    assert engine.ranks is not None
    pids = engine.ranks.pids
    engine.close()
    deadline = time.monotonic() + DEADLINE_S
    while not all(map(_gone, pids)):
        assert time.monotonic() < deadline, f"ranks {pids} still running"
        time.sleep(0.05)
