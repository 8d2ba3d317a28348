"""The draft model's weights and KV cache are part of the engine's memory plan: each KV block
is priced at the target's bytes plus the draft's (the draft keeps one block per target block),
under every sizing rule, and the draft's weights are on the device before the plan is made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_llama import save_tiny_llama

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.kv.sizing import GIB
from engine.step import model_load as model_load_module
from engine.step import runner as runner_module
from models.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("every_guess")  # guesses independent of timing

BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("target")
    save_tiny_llama(path)  # 2 layers, 2 KV heads of 16 dims
    return path


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("draft")
    save_tiny_llama(path, seed=1, num_hidden_layers=1)  # half the target's KV bytes per block
    return path


def _cache_bytes(cache: torch.Tensor) -> int:
    return cache.numel() * cache.element_size()


def _config(tiny_dir: Path, draft_dir: Path, **options: Any) -> EngineConfig:
    base: dict[str, Any] = {
        "model_dir": tiny_dir,
        "block_size": BLOCK_SIZE,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 64,
        "speculative_method": "draft",
        "draft_model": draft_dir,
    }
    return EngineConfig(**(base | options))


def _greedy(engine: LLMEngine, prompt: list[int], n: int) -> list[int]:
    engine.add_request("a", prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    out: list[int] = []
    while engine.has_unfinished():
        for o in engine.step():
            out += o.new_token_ids
    return out


def test_the_gib_budget_holds_both_caches_with_one_block_count(
    tiny_dir: Path, draft_dir: Path
) -> None:
    budget = 40 * (2048 + 1024) + 1000  # 40 blocks of target 2048 + draft 1024 bytes, and change
    engine = LLMEngine(_config(tiny_dir, draft_dir, kv_cache_memory_gb=budget / GIB))
    assert engine.speculator is not None and engine.speculator.draft is not None
    draft = engine.speculator.draft
    target_bytes = _cache_bytes(engine.runner.kv_cache)
    draft_bytes = _cache_bytes(draft.runner.kv_cache)
    assert (target_bytes, draft_bytes) == (40 * 2048, 40 * 1024)
    assert target_bytes + draft_bytes <= budget
    assert engine.runner.num_blocks == draft.runner.num_blocks == 40
    assert draft.runner.kv_cache.shape[0] == engine.runner.kv_cache.shape[0] == 40
    assert draft.blocks.num_total_blocks == engine.block_manager.num_total_blocks == 40
    capacity = engine.runner.kv_capacity
    assert (capacity.block_bytes, capacity.shared_block_bytes) == (2048, 1024)
    # and it decodes with guesses, the plain engine's tokens, every block given back
    prompt = [5, 9, 13, 17, 21, 5, 9, 13]
    plain = LLMEngine(EngineConfig(tiny_dir, block_size=BLOCK_SIZE, num_kv_blocks=40))
    assert _greedy(engine, prompt, 24) == _greedy(plain, prompt, 24)
    stats = engine.speculative_stats
    assert stats is not None and stats.proposed > 0
    assert engine.stats().free_blocks == engine.stats().total_blocks
    assert draft.blocks.num_free_blocks == draft.blocks.num_total_blocks


def test_a_budget_for_the_target_block_alone_is_refused_naming_both(
    tiny_dir: Path, draft_dir: Path
) -> None:
    budget = 3 * 1024 - 1  # one target block fits, not one of both
    with pytest.raises(ValueError, match="target 2048 \\+ draft 1024") as err:
        LLMEngine(_config(tiny_dir, draft_dir, kv_cache_memory_gb=budget / GIB))
    assert "kv_cache_memory_gb" in str(err.value)


def test_num_kv_blocks_is_an_exact_count_for_both(tiny_dir: Path, draft_dir: Path) -> None:
    engine = LLMEngine(_config(tiny_dir, draft_dir, num_kv_blocks=13))
    assert engine.speculator is not None and engine.speculator.draft is not None
    assert engine.runner.kv_cache.shape[0] == engine.speculator.draft.runner.kv_cache.shape[0] == 13


def test_a_prefill_node_keeps_the_whole_budget(tiny_dir: Path, draft_dir: Path) -> None:
    """The prefill role does not speculate: no draft is loaded and nothing is set aside."""
    engine = LLMEngine(
        _config(tiny_dir, draft_dir, role="prefill", kv_cache_memory_gb=40 * 2048 / GIB)
    )
    assert engine.speculator is None
    assert engine.runner.num_blocks == 40 and engine.runner.kv_capacity.shared_block_bytes == 0


def test_the_draft_loads_first_and_a_wrong_vocabulary_stops_before_the_target(
    tiny_dir: Path, draft_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The draft's weights are on the device when the target's plan runs (on CUDA its
    measurement counts them); a draft of another vocabulary is refused before the target's
    weights or cache are touched."""
    events: list[tuple[str, Any]] = []
    real_load, real_plan = model_load_module.load_weights, runner_module.plan_kv_cache
    real_allocate = runner_module.allocate_kv_cache

    def load(model: Any, model_dir: Path, *rest: Any) -> None:
        events.append(("load", Path(model_dir)))
        real_load(model, model_dir, *rest)

    def plan(config: EngineConfig, layout: Any, measure: Any, shared: Any = ()) -> Any:
        draft_bytes = sum(cache.block_bytes for cache in shared)
        events.append(("plan", (Path(config.model_dir), draft_bytes)))
        return real_plan(config, layout, measure, shared)

    def allocate(layout: Any, num_blocks: int, device: Any) -> torch.Tensor:
        events.append(("allocate", num_blocks))
        return real_allocate(layout, num_blocks, device)

    monkeypatch.setattr(model_load_module, "load_weights", load)
    monkeypatch.setattr(runner_module, "plan_kv_cache", plan)
    monkeypatch.setattr(runner_module, "allocate_kv_cache", allocate)
    LLMEngine(_config(tiny_dir, draft_dir, num_kv_blocks=16))
    assert events == [
        ("load", draft_dir),
        ("load", tiny_dir),
        ("plan", (tiny_dir, 1024)),  # the target's plan, with the draft's share
        ("allocate", 16),
        ("plan", (draft_dir, 0)),
        ("allocate", 16),
    ]
    events.clear()
    save_tiny_llama(tmp_path, vocab_size=96)
    with pytest.raises(ValueError, match="same vocabulary"):
        LLMEngine(_config(tiny_dir, tmp_path, num_kv_blocks=16))
    assert events == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_the_draft_stays_within_the_utilization(tiny_dir: Path, draft_dir: Path) -> None:
    """Sized by gpu_memory_utilization: the target's weights and cache and the draft's weights
    and cache fit in the fraction (before, the draft's cache came on top of a full plan)."""
    fraction = 0.03
    total = torch.cuda.mem_get_info()[1]
    config = _config(
        tiny_dir,
        draft_dir,
        device="cuda",
        dtype="bfloat16",
        block_size=16,  # fewer, larger blocks: a short start
        gpu_memory_utilization=fraction,
    )
    engine = LLMEngine(config)
    assert engine.runner.kv_capacity.sized_by == "gpu_memory_utilization"
    assert engine.speculator is not None and engine.speculator.draft is not None
    draft_cache = engine.speculator.draft.runner.kv_cache
    assert draft_cache.shape[0] == engine.runner.kv_cache.shape[0] > 1000
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= fraction * total
    assert len(_greedy(engine, [5, 9, 13, 17, 21, 5, 9, 13], 16)) == 16
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= fraction * total
