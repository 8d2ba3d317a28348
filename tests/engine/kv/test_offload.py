"""KV tiers below the device, end to end on a tiny model: a prefix evicted from the device is
loaded back from host memory instead of recomputed, and a full tier never breaks a step. The
oracle is the same engine without tiers (greedy tokens equal)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tier_driver import (
    BLOCK_BYTES,
    BS,
    back_to_start,
    conversation,
    disk_gib,
    engine,
    gib,
    prompt,
    run,
)
from tiny_llama import save_tiny_llama


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("offload")
    save_tiny_llama(path)
    return path


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
        kv_offload_disk_gb=disk_gib(11),
    )
    assert run(tiered, work) == expected
    tiered.close()
    stats = tiered.counters.kv_tiers
    assert (stats["host_capacity_blocks"], stats["disk_capacity_blocks"]) == (5, 11)
    for tier in ("host", "disk"):
        assert stats[f"{tier}_evictions"] > 0
        assert stats[f"{tier}_used_blocks"] <= stats[f"{tier}_capacity_blocks"]
    assert len(list((tmp_path / "kv").glob("*.kvb"))) == stats["disk_used_blocks"]
    back_to_start(tiered)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3"])
def test_quantized_blocks_move_through_the_tiers_with_their_scales(
    tiny_dir: Path, tmp_path: Path, kv_cache_dtype: str
) -> None:
    """The scales live in the block rows: a prefix loaded back from the host or disk tier
    gives the tokens of the same quantized engine whose device cache kept every prefix (a
    prefix hit reads the quantized K/V, a prompt computed afresh attends over its own)."""
    work = [(f"r{i}", prompt(i, 25)) for i in range(6)] + conversation()
    roomy = engine(tiny_dir, kv_cache_dtype=kv_cache_dtype, num_kv_blocks=256)
    expected = run(roomy, work)
    tiered = engine(
        tiny_dir,
        kv_cache_dtype=kv_cache_dtype,
        kv_offload_cpu_gb=gib(3),
        kv_offload_disk_path=tmp_path / "kv",
        kv_offload_disk_gb=disk_gib(40),
    )
    assert run(tiered, work) == expected
    tiered.close()
    stats = tiered.counters.kv_tiers
    assert stats["host_hits"] + stats["disk_hits"] > 0
    assert tiered.counters.prefix_hit_tokens == roomy.counters.prefix_hit_tokens
    block_bytes = tiered.runner.layout.block_bytes
    assert block_bytes == 2 * 2 * BS * 2 * (16 + 8)  # one-byte codes + 8 bytes of scales and mids
    assert stats["host_bytes_out"] == stats["host_loads"] * block_bytes
    back_to_start(tiered)
