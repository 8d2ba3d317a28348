"""bench.offline's MoE-layer timer counts every expert layer's forward and its active FLOPs."""

from __future__ import annotations

from pathlib import Path

from bench.moe_layers import MoeLayerTimer, describe
from engine.config import EngineConfig
from engine.engine import LLMEngine
from models.sampling_params import SamplingParams
from tests.engine.model.tiny_families import save_family


def test_timer_counts_each_sparse_layer_per_step(tmp_path: Path) -> None:
    save_family("qwen3_moe", tmp_path)  # layers 0 and 2 sparse: 8 experts of 32, top 2
    engine = LLMEngine(EngineConfig(model_dir=tmp_path, block_size=4, num_kv_blocks=32))
    timer = MoeLayerTimer.attach(engine.runner.model)
    assert timer is not None
    engine.add_request("a", list(range(3, 13)), SamplingParams(max_tokens=4, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    timer.detach()
    steps = engine.counters.steps
    assert timer.calls == 2 * steps
    # tokens through the layers: 10 prompt + 3 fed-back; router 8 + 3 x top-2 x 32 per token
    assert timer.flops == 2 * 64 * (8 + 3 * 2 * 32) * 2 * 13
    summary = timer.summary(run_seconds=timer.seconds * 2)
    assert summary["moe_share_of_run"] == 0.5 and summary["moe_gflop_s"] > 0
    assert "ratio to peak" in describe(summary, peak_gflops=100.0)
    engine.add_request("b", [3, 4], SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert engine.counters.steps > steps and timer.calls == 2 * steps  # detached: no hooks
