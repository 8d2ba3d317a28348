"""bench.offline's attention timer counts every layer's attention block and its FLOPs: the
projections, and the products with the keys each query sees (a windowed layer's window)."""

from __future__ import annotations

from pathlib import Path

from bench.attention_layers import AttentionLayerTimer, describe
from engine.config import EngineConfig
from engine.engine import LLMEngine
from models.sampling_params import SamplingParams
from tests.engine.model.tiny_families import WINDOW, save_family


def test_timer_counts_each_attention_block_per_step(tmp_path: Path) -> None:
    save_family("mistral", tmp_path)  # 2 layers, windows of 7; 4 heads of 16, 2 KV heads
    engine = LLMEngine(
        EngineConfig(model_dir=tmp_path, block_size=4, num_kv_blocks=32, max_num_batched_tokens=16)
    )
    timer = AttentionLayerTimer.attach(engine.runner.model)
    assert timer is not None
    engine.add_request("a", list(range(3, 13)), SamplingParams(max_tokens=4, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    timer.detach()
    steps = engine.counters.steps
    assert timer.calls == 2 * steps
    # 13 tokens through q/k/v (64 x (64 + 2 x 32)); position p sees min(p + 1, 7) keys
    keys = sum(min(p + 1, WINDOW) for p in range(13))
    per_layer = 2 * 64 * (64 + 2 * 32) * 13 + 2 * 4 * 2 * 16 * keys
    assert timer.flops == 2 * per_layer
    summary = timer.summary(run_seconds=timer.seconds * 4)
    assert summary["attention_share_of_run"] == 0.25 and summary["attention_gflop_s"] > 0
    assert "ratio to peak" in describe(summary, peak_gflops=100.0)
    engine.add_request("b", [3, 4], SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert engine.counters.steps > steps and timer.calls == 2 * steps  # detached
