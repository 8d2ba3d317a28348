"""Helpers of the KV tier tests: a tiny engine with or without tiers, prompts, a sequential
driver and the end-of-run accounting check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.kv.sizing import GIB
from models.sampling_params import SamplingParams

BS = 4
BLOCK_BYTES = 2 * 2 * BS * 2 * 16 * 4  # layers x K/V x tokens x kv heads x head_dim x fp32
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def gib(blocks: int) -> float:
    """kv_offload_cpu_gb for a host tier of that many blocks."""
    return (blocks + 0.5) * BLOCK_BYTES / GIB


def disk_gib(blocks: int) -> float:
    """kv_offload_disk_gb for a disk tier of that many block files (a 61-byte header, token
    ids, the block)."""
    return (blocks + 0.5) * (BLOCK_BYTES + 61 + 8 * BS) / GIB


def engine(tiny_dir: Path, **kw: Any) -> LLMEngine:
    options: dict[str, Any] = {
        "block_size": BS, "num_kv_blocks": 16, "max_num_seqs": 4, "max_num_batched_tokens": 64,
    }  # fmt: skip
    options.update(kw)
    return LLMEngine(EngineConfig(model_dir=tiny_dir, **options))


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 31 + 7 * j) % 120 + 3 for j in range(n)]


def run(eng: LLMEngine, work: list[tuple[str, list[int]]]) -> dict[str, list[int]]:
    """Each request to its end, one after the other, its copies done before the next."""
    out: dict[str, list[int]] = {}
    for rid, tokens in work:
        eng.add_request(rid, tokens, GREEDY)
        while eng.has_unfinished():
            for o in eng.step():
                out.setdefault(o.request_id, []).extend(o.new_token_ids)
        eng.scheduler.audit()
        if eng.kv_tiers is not None:  # its copies done: no write is skipped for the backlog
            eng.kv_tiers.submit()
            eng.kv_tiers.copier.flush()
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
