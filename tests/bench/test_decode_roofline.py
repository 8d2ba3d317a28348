"""The decode-step roofline of bench.offline on CUDA: its arithmetic on known numbers, and the
timed decode steps (run here on the CPU with a tiny model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_llama import TINY, save_tiny_llama

from bench.common import ModelShape
from bench.decode_step import WARMUP_STEPS, DecodeTiming, decode_step_report, time_decode_steps
from bench.roofline import DecodeStepCost, decode_step_cost, roofline
from engine.config import EngineConfig
from engine.engine import LLMEngine

# layer_params = 2*4*2*2 (q, o) + 2*4*1*2 (k, v) + 3*4*8 (mlp) = 144; weights 2*144 + 4*10 = 328
TOY = ModelShape(hidden=4, intermediate=8, layers=2, heads=2, kv_heads=1, head_dim=2, vocab=10)


def test_cost_of_a_decode_step() -> None:
    cost = decode_step_cost(TOY, batch=3, context_tokens=100, dtype_bytes=2)
    assert cost.weight_bytes == 328 * 2
    assert cost.kv_bytes == 100 * (2 * 2 * 1 * 2) * 2  # tokens x layers x K,V x heads x dim x 2 B
    assert cost.flops == 2 * 328 * 3 + 4 * 2 * 2 * 2 * 100  # 1968 + 3200
    assert cost.bytes == 656 + 1600


def test_roofline_takes_the_slower_limit() -> None:
    cost = DecodeStepCost(weight_bytes=600, kv_bytes=400, flops=5000)
    line = roofline(cost, traffic_gbps=1.0, matmul_gflops=1.0)
    assert (line.memory_s, line.compute_s) == pytest.approx((1e-6, 5e-6))
    assert (line.seconds, line.bound) == (pytest.approx(5e-6), "compute")
    line = roofline(cost, traffic_gbps=0.1, matmul_gflops=1.0)
    assert (line.seconds, line.bound) == (pytest.approx(1e-5), "memory")


@pytest.mark.parametrize(("batch", "context", "dtype_bytes"), [(0, 10, 2), (4, 3, 2), (1, 1, 0)])
def test_impossible_steps_are_refused(batch: int, context: int, dtype_bytes: int) -> None:
    with pytest.raises(ValueError, match="batch"):
        decode_step_cost(TOY, batch, context, dtype_bytes)
    with pytest.raises(ValueError, match="limits"):
        roofline(DecodeStepCost(1, 1, 1), 0.0, 1.0)


def test_report_is_the_step_over_its_roofline() -> None:
    timing = DecodeTiming(batch=3, steps=8, median_step_s=2e-5, mean_context_tokens=100)
    report = decode_step_report(timing, TOY, torch.bfloat16, traffic_gbps=1.0, matmul_gflops=1.0)
    assert report["roofline_s"] == pytest.approx(5.168e-6)  # compute: 5168 FLOPs at 1 GFLOP/s
    assert report["step_over_roofline"] == pytest.approx(2e-5 / 5.168e-6)
    assert report["bound"] == "compute" and report["kv_bytes"] == 1600


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny")
    save_tiny_llama(path)
    return path


def engine(model_dir: Path, budget: int) -> LLMEngine:
    config = EngineConfig(
        model_dir, block_size=4, num_kv_blocks=64, max_num_seqs=3, max_num_batched_tokens=budget
    )
    return LLMEngine(config)


def test_timed_steps_decode_the_whole_batch(tiny_dir: Path) -> None:
    prompts = [[5] * 5, [6] * 7, [7] * 9]
    llm = engine(tiny_dir, budget=64)  # every prompt prefilled in the first step
    timing = time_decode_steps(llm, prompts, steps=4)
    assert (timing.batch, timing.steps) == (3, 4)
    assert timing.median_step_s > 0
    # contexts: 21 prompt tokens + 3 first tokens + 3 per warm-up step, then 3 per timed step
    assert timing.mean_context_tokens == 21 + 3 + 3 * WARMUP_STEPS + 3 * 3 // 2
    assert not llm.has_unfinished() and llm.stats().free_blocks == 64


def test_chunked_prefill_is_waited_out(tiny_dir: Path) -> None:
    """A budget smaller than the prompts: decodes start while others still prefill."""
    prompts = [[5] * 5, [6] * 7, [7] * 9]
    llm = engine(tiny_dir, budget=6)
    timing = time_decode_steps(llm, prompts, steps=2)
    assert timing.mean_context_tokens > 21 + 3 + 3 * WARMUP_STEPS
    assert timing.mean_context_tokens <= TINY["max_position_embeddings"] * 3
    assert not llm.has_unfinished() and llm.stats().free_blocks == 64


def test_a_random_weight_shape_is_measured_with_its_load_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.offline --random-model hands its engine settings on: the model directory holds
    a config alone, its weights are drawn (a checkpoint load would fail)."""
    from bench import decode_step
    from bench.random_model import write_random_model_dir

    monkeypatch.setattr(decode_step, "COPY_BYTES", 1 << 20)
    model_dir = write_random_model_dir("tiny", tmp_path / "tiny")
    report = decode_step.measure_decode_step(
        model_dir, [[5] * 6, [9] * 4], "float32", "cpu", 64, 2, 1.0, {"load_format": "random"}
    )
    assert report["batch"] == 2 and report["step_over_roofline"] > 0
