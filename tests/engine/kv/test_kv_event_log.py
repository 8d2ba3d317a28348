"""The prefix cache's KV events: what the block manager records, and that the router's
hashes (models.block_hash) name the engine's blocks."""

from __future__ import annotations

from engine.kv.block_manager import BlockManager
from engine.kv.events import KVEventLog
from engine.scheduler.request import Request
from models.block_hash import prefix_block_hashes
from models.sampling_params import SamplingParams

BS = 4


def _computed(bm: BlockManager, rid: str, tokens: list[int]) -> Request:
    request = Request(request_id=rid, prompt_token_ids=list(tokens), params=SamplingParams())
    assert bm.allocate(request, len(tokens), bm.match_prefix(tokens))
    request.num_computed_tokens = len(tokens)
    bm.commit_full_blocks(request)
    return request


def test_router_hashes_equal_the_engines_for_the_same_token_ids() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    log = bm.record_events(100)
    tokens = [7, 1, 9, 4, 4, 2, 8, 8, 3, 5, 0, 6, 1]  # three full blocks and a partial one
    _computed(bm, "a", tokens)
    router_side = prefix_block_hashes(tokens, BS)
    changes = log.drain()
    assert [h for h, _ in changes.stored] == router_side
    assert [p for _, p in changes.stored] == [None, *router_side[:-1]]
    assert sorted(bm.cached_blocks()) == sorted(changes.stored)


def test_evictions_are_recorded_once_the_blocks_are_reused() -> None:
    bm = BlockManager(3, BS, enable_prefix_caching=True)
    log = bm.record_events(100)
    bm.free(_computed(bm, "a", list(range(8))))  # 2 cached blocks, evictable
    first = prefix_block_hashes(list(range(8)), BS)
    assert log.drain().stored == [(first[0], None), (first[1], first[0])]
    other = _computed(bm, "b", list(range(100, 112)))  # needs all 3 blocks: evicts both
    changes = log.drain()
    assert sorted(changes.removed) == sorted(first)
    assert [h for h, _ in changes.stored] == prefix_block_hashes(list(range(100, 112)), BS)
    assert bm.cached_blocks() == changes.stored
    bm.audit([other.block_ids])


def test_the_log_keeps_the_net_change_and_reports_an_overflow() -> None:
    log = KVEventLog(capacity=2)
    log.stored(1, None)
    log.removed(1)
    log.stored(2, 1)
    assert log.drain().removed == [1]
    assert log.drain().empty
    for h in range(3):
        log.stored(h, None)
    overflowed = log.drain()
    assert overflowed.overflowed and overflowed.stored == []
    assert log.drain().empty
