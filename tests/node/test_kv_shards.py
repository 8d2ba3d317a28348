"""What a tensor-parallel node hands its transfer agent: every rank's KV tensor (the memory
the ranks write, seen from rank 0's process) with the heads it holds, and a layout that is
the same whatever the tensor-parallel size (so pools of different sizes match)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from kv_transfer.head_plan import HeadSpan
from models.sampling_params import SamplingParams
from node.kv_shards import kv_shards, layout_text, model_layout
from tests.engine.engine_driver import drive
from tests.engine.tiny_llama import save_tiny_llama

PROMPT = [1, 5, 9, 33, 7, 100, 3, 17, 64, 12, 80, 41, 6, 22, 90, 3, 15, 8, 19, 40]


def run(model_dir: Path, tp: int) -> tuple[LLMEngine, torch.Tensor]:
    """An engine of ``tp`` ranks after one request; its KV heads joined over the ranks."""
    engine = LLMEngine(EngineConfig(model_dir=model_dir, tensor_parallel_size=tp, num_kv_blocks=16))
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    drive(engine, [("r0", PROMPT, params)], {})
    return engine, engine.runner.kv_cache.clone()


@pytest.mark.parametrize(
    ("kv_heads", "spans"),
    [(2, [HeadSpan(0, 1), HeadSpan(1, 1)]), (1, [HeadSpan(0, 1), HeadSpan(0, 1)])],
    ids=["split", "replicated"],
)
def test_each_rank_tensor_holds_its_heads_of_the_whole_cache(
    tmp_path: Path, kv_heads: int, spans: list[HeadSpan]
) -> None:
    save_tiny_llama(tmp_path, num_key_value_heads=kv_heads)
    one, whole = run(tmp_path, 1)
    try:
        assert kv_shards(one) is None
        two, _ = run(tmp_path, 2)
        try:
            shards = kv_shards(two)
            assert shards is not None and shards.spans == spans
            assert shards.num_kv_heads == kv_heads
            assert whole.abs().sum() > 0  # the request wrote KV
            for tensor, span in zip(shards.tensors, spans, strict=True):
                want = whole[:, :, :, :, span.start : span.stop]
                torch.testing.assert_close(tensor, want, rtol=1e-4, atol=1e-5)
            assert model_layout(two).fingerprint() == model_layout(one).fingerprint()
            assert layout_text(two).endswith("tp=2 pp=1") and layout_text(one).endswith("tp=1 pp=1")
        finally:
            two.close()
    finally:
        one.close()
