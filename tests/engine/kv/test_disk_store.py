"""The disk KV tier across a restart: a known conversation's first request loads its prefix
from disk, one long prompt's blocks come back nearly all; corrupted, truncated, foreign and
stray files are dropped and counted, and the answer is still the offline engine's."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from tier_driver import BS, GREEDY, back_to_start, conversation, disk_gib, engine, gib, prompt, run
from tiny_llama import save_tiny_llama

from engine.engine import LLMEngine
from engine.kv.copier import KVLoadError
from engine.kv.disk_store import DiskStore
from models.block_hash import prefix_block_hashes

FIRST = prompt(1, 30)  # the known conversation's first turn: 7 full blocks
NEXT = [("again", FIRST + prompt(3, 5))]  # its next turn, after the restart


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("disk")
    save_tiny_llama(path)
    return path


def with_disk_options(kv_dir: Path) -> dict[str, Any]:
    return {
        "kv_offload_cpu_gb": gib(64),
        "kv_offload_disk_path": kv_dir,
        "kv_offload_disk_gb": disk_gib(64),
    }


def with_disk(tiny_dir: Path, kv_dir: Path) -> LLMEngine:
    return engine(tiny_dir, **with_disk_options(kv_dir))


def first_life(tiny_dir: Path, kv_dir: Path) -> None:
    """A node serves a conversation and others, then stops (its files written)."""
    node = with_disk(tiny_dir, kv_dir)
    run(node, conversation())
    node.close()
    assert node.counters.kv_tiers["disk_stores"] > 7


def test_a_restarted_node_loads_a_known_prefix_from_disk(tiny_dir: Path, tmp_path: Path) -> None:
    expected = run(engine(tiny_dir), NEXT)
    first_life(tiny_dir, tmp_path)
    node = with_disk(tiny_dir, tmp_path)
    assert run(node, NEXT) == expected
    stats = node.counters.kv_tiers
    assert stats["disk_hits"] == stats["disk_loads"] == 7  # (30 - 1) // 4 blocks reusable
    assert node.scheduler.get("again") is None
    assert node.counters.prefix_hit_tokens == 7 * BS
    assert not any(k.startswith("disk_files_dropped") for k in stats)
    back_to_start(node)
    node.close()


def test_a_restart_after_one_long_prompt_gets_its_blocks_back_from_disk(
    tiny_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its 51 blocks leave the device at once, a burst of file writes that the shutdown
    flushes; the restarted node indexes them all and loads them."""
    long = [("long", prompt(5, 200))]
    expected = run(engine(tiny_dir, num_kv_blocks=64), long)
    first = engine(tiny_dir, num_kv_blocks=64, **with_disk_options(tmp_path))
    first.add_request("long", long[0][1], GREEDY)
    while first.has_unfinished():
        first.step()
    caplog.set_level(logging.INFO, logger="splitserve.engine.kv.offload")
    first.close()  # stopped at once: its blocks are written now, at the latest
    assert "kv_tier_flush blocks_flushed=51 dropped=0 " in caplog.text
    node = engine(tiny_dir, num_kv_blocks=64, **with_disk_options(tmp_path))
    assert "disk_files=51 disk_blocks_indexed=51 " in caplog.text
    assert run(node, long) == expected
    assert node.counters.kv_tiers["disk_hits"] >= 0.9 * ((200 - 1) // BS)  # the reusable
    node.close()


def test_bad_files_are_dropped_counted_and_never_served(tiny_dir: Path, tmp_path: Path) -> None:
    expected = run(engine(tiny_dir), NEXT)
    first_life(tiny_dir, tmp_path)
    files = sorted(tmp_path.glob("*.kvb"))
    hashes = prefix_block_hashes(FIRST, BS)  # the known conversation's blocks
    corrupt, truncated = (tmp_path / f"{h:016x}.kvb" for h in hashes[:2])
    foreign = next(f for f in files if f not in (corrupt, truncated))
    data = bytearray(corrupt.read_bytes())
    data[-5] ^= 0xFF  # one payload byte
    corrupt.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:-100])
    data = bytearray(foreign.read_bytes())
    data[12:28] = b"0123456789abcdef"  # another layout's fingerprint
    foreign.write_bytes(bytes(data))
    (tmp_path / "0000000000000001.kvb").write_bytes(b"not a block" * 100)
    (tmp_path / ".leftover.kvb.99.tmp").write_bytes(b"half written")
    node = with_disk(tiny_dir, tmp_path)
    stats = node.counters.kv_tiers
    assert node.kv_tiers is not None
    assert dict(node.kv_tiers.disk_files_dropped) == {
        "checksum": 1, "truncated": 1, "foreign layout": 1, "not a block file": 1,
        "unfinished": 1,
    }  # fmt: skip
    assert len(list(tmp_path.glob("*.kvb"))) == len(files) - 3
    assert run(node, NEXT) == expected
    stats = node.counters.kv_tiers
    assert stats["disk_files_dropped_checksum"] == 1
    assert stats["disk_hits"] == 0  # its first block is gone: the chain starts with a miss
    back_to_start(node)
    node.close()


def test_a_file_gone_bad_after_the_start_fails_its_step_and_is_never_served(
    tiny_dir: Path, tmp_path: Path
) -> None:
    expected = run(engine(tiny_dir), NEXT)
    first_life(tiny_dir, tmp_path)
    node = with_disk(tiny_dir, tmp_path)  # indexed every file as good
    bad = tmp_path / f"{prefix_block_hashes(FIRST, BS)[3]:016x}.kvb"
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))
    rid, tokens = NEXT[0]
    node.add_request(rid, tokens, GREEDY)
    with pytest.raises(KVLoadError, match="checksum"):
        while node.has_unfinished():
            node.step()
    assert node.abort(rid)  # what the engine loop does with a failed step's requests
    assert node.kv_tiers is not None
    assert node.kv_tiers.disk_files_dropped == {"bad at load": 1}
    assert run(node, [("retry", tokens)]) == {"retry": expected[rid]}
    # the retry finds the 3 blocks before the bad one on the device, none on disk past it
    assert node.counters.kv_tiers["disk_loads"] == 7
    assert node.counters.prefix_hit_tokens == 7 * BS + 3 * BS
    node.close()
    # the bad file was deleted; the retry's recomputed block was written back, good
    assert not DiskStore(tmp_path, node.runner.layout).scan().dropped
    back_to_start(node)
