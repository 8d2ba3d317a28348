"""The lower tiers' bookkeeping on plain integers: LRU per tier, reserved slots never evicted,
collisions refused, write-behind to host then disk in order, drops counted past the backlog,
a burst of file writes held in the host tier until written (never dropped while there is
room), and the KV events saying which tier holds a block."""

from __future__ import annotations

import pytest

from engine.kv.events import KVEventLog
from engine.kv.tier_book import MAX_BACKLOG, CopyKind, TierBook, copy_backlog
from engine.kv.tier_index import TierIndex
from engine.kv.tiered_blocks import TieredBlockManager
from engine.scheduler.request import Request
from models.sampling_params import SamplingParams


def test_the_index_evicts_least_recently_used_and_never_a_reserved_slot() -> None:
    tier = TierIndex("host", 3)
    for h in (1, 2, 3):
        tier.insert(h, None, (h,))
    assert tier.find(1, (1,), None) is not None  # 1 is now the most recent
    assert tier.find(2, (9,), None) is None  # other tokens: a collision, a miss
    assert tier.find(2, (2,), 7) is None  # another parent: a miss
    slot, evicted = tier.reserve()
    assert [e.block_hash for e in evicted] == [2] and slot == evicted[0].slot
    _, evicted = tier.insert(4, None, (4,))
    assert [e.block_hash for e in evicted] == [3]
    tier.reserve()
    tier.reserve()
    assert tier.reserve() == (None, []) and tier.insert(5, None, (5,)) == (None, [])
    assert tier.counters.evictions == 4
    tier.audit()


def test_write_behind_goes_to_host_then_disk_in_order_and_drops_past_the_backlog() -> None:
    book = TierBook(host_blocks=2, disk_blocks=2, max_backlog=5)
    book.save(7, 100, None, (1, 2))
    orders, _ = book.take_orders()
    assert [o.kind for o in orders] == [CopyKind.DEVICE_TO_HOST, CopyKind.HOST_TO_DISK]
    assert orders[0].block_id == 7 and orders[1].slot == orders[0].slot
    book.save(8, 101, 100, (3, 4))
    book.writes_done(2)  # the copier wrote both files
    book.save(9, 102, 101, (5, 6))  # host full: 100 leaves it, stays on disk; disk full too
    kinds = [o.kind for o in book.take_orders()[0]]
    assert kinds.count(CopyKind.DELETE_FILE) == 1
    assert book.where(100) is None and book.where(101) == "host"
    book.backlog = 5
    book.save(10, 103, None, (7, 8))
    assert book.host.counters.dropped == 1 and book.take_orders() == ([], [])
    book.audit()


def test_a_burst_of_file_writes_is_kept_until_written_not_dropped() -> None:
    burst = MAX_BACKLOG // 2  # far more than any queue of file writes used to take
    book = TierBook(host_blocks=burst, disk_blocks=2 * burst)
    for i in range(burst):
        book.save(i, 1000 + i, None, (i,))
    orders, _ = book.take_orders()
    assert sum(o.kind is CopyKind.HOST_TO_DISK for o in orders) == burst
    assert book.disk is not None and book.disk.counters.dropped == 0
    # every host slot waits for its file write: neither a new block nor a swap may take one
    book.save(burst, 1000 + burst, None, (burst,))
    assert book.host.counters.dropped == book.disk.counters.dropped == 1
    assert book.where(1000 + burst) is None and book.swap_out([0]) is None
    book.writes_done(2)  # the copier wrote the first two: they may leave the host tier
    book.save(burst + 1, 2000, None, (burst + 1,))
    assert book.where(1000) == "disk" and book.where(2000) == "host"
    assert book.host.num_pinned == burst - 2 + 1
    book.audit()


def test_a_long_prompts_burst_of_memory_copies_is_kept_at_the_copiers_rate() -> None:
    """A 10,000-token prompt's 625 blocks of 16 leave the device at once. The copier moves
    10 GB/s of 0.74 MB blocks: 678 copies take 50 ms, the most a step's loads may wait."""
    backlog = copy_backlog(10e9, 737_280)
    assert backlog == 678 and copy_backlog(1e9, 737_280) == MAX_BACKLOG
    book = TierBook(host_blocks=1000, max_backlog=backlog)
    for i in range(backlog + 1):
        book.save(i, 1000 + i, None, (i,))
    assert len(book.host) == backlog and book.host.counters.dropped == 1


def _request(rid: str, tokens: list[int]) -> Request:
    return Request(request_id=rid, prompt_token_ids=tokens, params=SamplingParams())


def test_events_follow_a_block_down_the_tiers_and_out() -> None:
    bm = TieredBlockManager(2, 2, True, TierBook(host_blocks=1))
    log = bm.record_events(100)
    first = _request("a", [1, 2, 3])
    assert bm.allocate(first, 3)
    first.num_computed_tokens = 3
    bm.commit_full_blocks(first)
    bm.free(first)
    ((block_hash, _),) = log.drain().stored
    other = _request("b", [5, 6, 7, 8, 9])
    assert bm.allocate(other, 4)  # takes both blocks: the cached one leaves the device
    assert log.drain().lower == [(block_hash, None, "host")]
    assert bm.match_lower([1, 2, 3], []) != []
    bm.tiers.save(1, 999, None, (4, 4))  # the host tier's one slot goes to another block
    assert log.drain().removed == [block_hash]
    bm.free(other)
    bm.audit([])


def test_a_swapped_request_keeps_its_slots_until_it_is_back_or_gone() -> None:
    bm = TieredBlockManager(4, 2, True, TierBook(host_blocks=3))
    request = _request("a", [1, 2, 3, 4, 5])
    assert bm.allocate(request, 5)
    request.num_computed_tokens = 5
    assert bm.swap_out(request)
    assert request.block_ids == [] and len(request.swapped_slots) == 3
    assert bm.tiers.host.num_reserved == 3 and bm.num_free_blocks == 4
    assert not bm.swap_out(_request("b", [1]))  # nothing to swap
    assert bm.swap_in(request, 6)
    assert len(request.block_ids) == 3 and bm.tiers.host.num_reserved == 0
    orders, _ = bm.tiers.take_orders()
    kinds = [o.kind for o in orders]
    assert kinds == [CopyKind.DEVICE_TO_HOST] * 3 + [CopyKind.HOST_TO_DEVICE] * 3
    assert all(o.blocking for o in orders)
    assert bm.swap_out(request)
    bm.free(request)  # aborted while swapped out
    assert bm.tiers.host.num_reserved == 0
    with pytest.raises(RuntimeError, match="not swapped out"):
        bm.swap_in(request, 2)
    bm.audit([])


def test_an_event_log_keeps_the_latest_tier_of_a_block() -> None:
    log = KVEventLog()
    log.stored(1, None)
    log.stored(1, None, "host")
    log.stored(2, 1, "disk")
    changes = log.drain()
    assert changes.stored == [] and changes.lower == [(1, None, "host"), (2, 1, "disk")]
