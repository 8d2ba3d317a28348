"""The import steps on plain numbers: which blocks move."""

from __future__ import annotations

from decode_node.importer import transfer_pairs
from engine.scheduler.plan import ImportPlan


def test_only_blocks_missing_from_the_local_cache_move() -> None:
    # 9 KV tokens in blocks of 4: the first block is cached here, blocks 2 and 3 move
    plan = ImportPlan(block_ids=(7, 8, 9), num_cached_tokens=4, num_kv_tokens=9, block_size=4)
    assert transfer_pairs(plan, [20, 21, 22]) == ([21, 22], [8, 9])


def test_a_fully_cached_prompt_moves_no_block() -> None:
    # 8 KV tokens, both blocks cached; block 9 (the next token's) is the request's own
    plan = ImportPlan(block_ids=(7, 8, 9), num_cached_tokens=8, num_kv_tokens=8, block_size=4)
    assert transfer_pairs(plan, [20, 21]) == ([], [])
