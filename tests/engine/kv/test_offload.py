"""KV tiers below the device, end to end on a tiny model: a prefix evicted from the device is
loaded back from host memory or disk instead of recomputed, preemption swaps or recomputes,
the disk tier survives a restart and refuses bad files, and a full tier never breaks a step.
The oracle is the same engine without tiers (greedy tokens equal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiny_llama import save_tiny_llama

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.kv.sizing import GIB
from models.sampling_params import SamplingParams

BS = 4
BLOCK_BYTES = 2 * 2 * BS * 2 * 16 * 4  # layers x K/V x tokens x kv heads x head_dim x fp32
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def gib(blocks: int) -> float:
    return (blocks + 0.5) * BLOCK_BYTES / GIB


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("offload")
    save_tiny_llama(path)
    return path


def engine(tiny_dir: Path, **kw: Any) -> LLMEngine:
    options: dict[str, Any] = {
        "block_size": BS, "num_kv_blocks": 16, "max_num_seqs": 4, "max_num_batched_tokens": 64,
    }  # fmt: skip
    options.update(kw)
    return LLMEngine(EngineConfig(model_dir=tiny_dir, **options))


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 31 + 7 * j) % 120 + 3 for j in range(n)]


def run(eng: LLMEngine, work: list[tuple[str, list[int]]]) -> dict[str, list[int]]:
    """Each request to its end, one after the other."""
    out: dict[str, list[int]] = {}
    for rid, tokens in work:
        eng.add_request(rid, tokens, GREEDY)
        while eng.has_unfinished():
            for o in eng.step():
                out.setdefault(o.request_id, []).extend(o.new_token_ids)
        eng.scheduler.audit()
    return out


def back_to_start(eng: LLMEngine) -> None:
    """Every device block free (or cached), nothing reserved in any tier, indexes sound."""
    assert not eng.has_unfinished()
    eng.scheduler.audit()
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_total_blocks
    assert eng.kv_tiers is not None
    for tier in eng.kv_tiers.book.tiers:
        assert tier.num_reserved == 0
        assert len(tier) <= tier.capacity


def conversation() -> list[tuple[str, list[int]]]:
    """Turn 1, then other prompts that push it out of the device cache, then turn 2."""
    first = prompt(1, 30)
    work = [("turn1", first)]
    work += [(f"other{i}", prompt(10 + i, 30)) for i in range(3)]
    work.append(("turn2", first + prompt(2, 6)))
    return work


def test_an_evicted_prefix_is_loaded_from_the_host_tier(tiny_dir: Path) -> None:
    plain = engine(tiny_dir)
    expected = run(plain, conversation())
    tiered = engine(tiny_dir, kv_offload_cpu_gb=gib(64))
    assert run(tiered, conversation()) == expected
    stats = tiered.counters.kv_tiers
    assert stats["host_hits"] >= 7 and stats["host_loads"] == stats["host_hits"]
    assert stats["host_bytes_out"] == stats["host_loads"] * BLOCK_BYTES
    saved = tiered.counters.prefix_hit_tokens - plain.counters.prefix_hit_tokens
    assert saved == stats["host_hits"] * BS
    assert tiered.counters.tokens_computed == plain.counters.tokens_computed - saved
    back_to_start(tiered)
    tiered.close()


def test_each_tier_filled_past_its_size(tiny_dir: Path, tmp_path: Path) -> None:
    work = [(f"r{i}", prompt(i, 25)) for i in range(12)] + conversation()
    expected = run(engine(tiny_dir), work)
    tiered = engine(
        tiny_dir,
        kv_offload_cpu_gb=gib(5),
        kv_offload_disk_path=tmp_path / "kv",
        kv_offload_disk_gb=11 * (BLOCK_BYTES + 200) / GIB,
    )
    assert run(tiered, work) == expected
    tiered.close()
    stats = tiered.counters.kv_tiers
    for tier in ("host", "disk"):
        assert stats[f"{tier}_evictions"] > 0
        assert stats[f"{tier}_used_blocks"] <= stats[f"{tier}_capacity_blocks"]
    assert len(list((tmp_path / "kv").glob("*.kvb"))) == stats["disk_used_blocks"]
    back_to_start(tiered)
