"""Block manager: ref counts, chained prefix hashing, collisions, LRU and tail-first freeing."""

from __future__ import annotations

import pytest

from engine.kv import block_manager as bm_module
from engine.kv.block_manager import BlockManager, block_hash
from engine.scheduler.request import Request
from models.sampling_params import SamplingParams

BS = 4


def _request(rid: str, tokens: list[int]) -> Request:
    return Request(request_id=rid, prompt_token_ids=list(tokens), params=SamplingParams())


def _computed(bm: BlockManager, rid: str, tokens: list[int]) -> Request:
    """A request admitted with its prefix hits, fully computed and committed."""
    request = _request(rid, tokens)
    hits = bm.match_prefix(tokens)
    assert bm.allocate(request, len(tokens), hits)
    request.num_computed_tokens = len(tokens)
    bm.commit_full_blocks(request)
    return request


def test_allocate_grows_the_table_and_free_returns_every_block() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    request = _request("a", list(range(10)))
    assert bm.allocate(request, 10)
    assert len(request.block_ids) == 3
    assert bm.allocate(request, 12)  # still fits in 3 blocks
    assert len(request.block_ids) == 3
    assert bm.allocate(request, 13)
    assert len(request.block_ids) == 4
    assert bm.num_free_blocks == 4 and bm.usage == pytest.approx(0.5)
    bm.audit([request.block_ids])
    bm.free(request)
    assert request.block_ids == []
    assert bm.num_free_blocks == 8 and bm.usage == 0.0
    bm.audit([])


def test_allocate_without_room_changes_nothing() -> None:
    bm = BlockManager(4, BS, enable_prefix_caching=True)
    holder = _computed(bm, "a", list(range(8)))  # 2 blocks
    request = _request("b", list(range(100, 112)))
    assert not bm.allocate(request, 12)  # needs 3, 2 free
    assert request.block_ids == [] and request.num_computed_tokens == 0
    assert bm.num_free_blocks == 2
    bm.audit([holder.block_ids])


def test_prefix_blocks_are_shared_and_the_hash_is_chained() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    first = _computed(bm, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13])
    assert bm.num_cached_blocks == 3
    # Same first two blocks, different third: two hits.
    second_tokens = [1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 1]
    assert bm.match_prefix(second_tokens) == first.block_ids[:2]
    # Block 2 of `first` alone, under a different first block: chained, so no hit at all.
    assert bm.match_prefix([9, 9, 9, 9, 5, 6, 7, 8, 1]) == []
    second = _request("b", second_tokens)
    hits = bm.match_prefix(second_tokens)
    free_before = bm.num_free_blocks
    assert bm.allocate(second, len(second_tokens), hits)
    assert second.block_ids[:2] == first.block_ids[:2]
    assert second.num_cached_tokens == second.num_computed_tokens == 8
    assert bm.num_free_blocks == free_before - 2  # only the 2 new blocks
    assert bm.num_prefix_hit_tokens == 8
    bm.audit([first.block_ids, second.block_ids])
    bm.free(first)
    bm.free(second)
    assert bm.num_free_blocks == 16
    bm.audit([])


def test_match_always_leaves_a_token_to_compute() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    tokens = list(range(8))
    held = _computed(bm, "a", tokens + [99])
    assert bm.match_prefix(tokens) == held.block_ids[:1]  # not both: 8 is not < 8
    assert bm.match_prefix([*tokens, 5]) == held.block_ids[:2]


def test_revived_cached_blocks_count_against_free_blocks() -> None:
    bm = BlockManager(3, BS, enable_prefix_caching=True)
    bm.free(_computed(bm, "a", list(range(8))))  # 2 evictable blocks
    assert bm.num_free_blocks == 3
    request = _request("b", [*range(8), 50, 51, 52, 53, 54])
    hits = bm.match_prefix(request.prompt_token_ids)
    assert len(hits) == 2
    assert not bm.allocate(request, 13, hits)  # 2 revived + 2 new > 3
    assert request.block_ids == [] and bm.num_free_blocks == 3
    assert bm.allocate(request, 12, hits)  # 2 revived + 1 new
    assert bm.num_free_blocks == 0
    bm.audit([request.block_ids])


def test_generated_tokens_are_committed_too() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    request = _request("a", [1, 2, 3])
    assert bm.allocate(request, 3)
    request.num_computed_tokens = 3
    request.output_token_ids += [4, 5]
    bm.commit_full_blocks(request)
    assert bm.num_cached_blocks == 0  # block 0 not computed in full yet
    assert bm.allocate(request, 5)
    request.num_computed_tokens = 4
    bm.commit_full_blocks(request)
    assert bm.match_prefix([1, 2, 3, 4, 7]) == request.block_ids[:1]


def test_hash_collision_is_a_miss_not_a_wrong_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bm_module, "block_hash", lambda parent, tokens: 7)
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    x = [1, 1, 1, 1]
    held = _computed(bm, "a", [*x, *x, 2])  # block 1 collides with block 0: not registered
    assert bm.num_cached_blocks == 1
    assert bm.match_prefix([2, 2, 2, 2, 3]) == []  # same hash, other tokens
    # Same tokens as block 0 but at position 1 (other parent): one hit, not two.
    assert bm.match_prefix([*x, *x, 5]) == held.block_ids[:1]
    other = _computed(bm, "b", [3, 3, 3, 3, 4])
    assert other.num_cached_tokens == 0
    bm.audit([held.block_ids, other.block_ids])


def test_eviction_prefers_free_blocks_then_lru_tail_first() -> None:
    bm = BlockManager(4, BS, enable_prefix_caching=True)
    a_tokens = list(range(8))
    b_tokens = list(range(100, 108))
    a = _computed(bm, "a", a_tokens)
    a0, a1 = a.block_ids
    bm.free(a)  # evictable: a1, a0
    b = _computed(bm, "b", b_tokens)
    assert not set(b.block_ids) & {a0, a1}  # took the two never-cached blocks
    bm.free(b)  # evictable: a1, a0, b1, b0
    assert bm.match_prefix([*a_tokens, 0]) == [a0, a1]

    def take_one(rid: str) -> None:
        assert bm.allocate(_request(rid, [500]), 1)

    take_one("c")  # evicts a's tail
    assert bm.match_prefix([*a_tokens, 0]) == [a0]
    take_one("d")  # then a's head
    assert bm.match_prefix([*a_tokens, 0]) == []
    assert len(bm.match_prefix([*b_tokens, 0])) == 2
    take_one("e")  # then b's tail
    assert len(bm.match_prefix([*b_tokens, 0])) == 1


def test_shared_prefix_outlives_the_suffixes() -> None:
    bm = BlockManager(3, BS, enable_prefix_caching=True)
    prefix = [7, 7, 7, 7]
    a = _computed(bm, "a", [*prefix, 1, 1, 1, 1])
    b = _computed(bm, "b", [*prefix, 2, 2, 2, 2])
    shared = a.block_ids[0]
    assert b.block_ids[0] == shared
    bm.free(a)
    bm.free(b)  # evictable: a1, b1, shared
    assert bm.allocate(_request("c", [0]), 8)  # two evictions: both suffixes
    assert bm.match_prefix([*prefix, 1, 1, 1, 1, 0]) == [shared]
    assert bm.match_prefix([*prefix, 2, 2, 2, 2, 0]) == [shared]


def test_duplicate_content_keeps_one_cached_copy_and_the_chain_goes_on() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    a = _request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = _request("b", [1, 2, 3, 4, 9, 9, 9, 9, 9])
    for request in (a, b):  # admitted together: no hits for either
        assert bm.allocate(request, 9)
    for request in (a, b):
        request.num_computed_tokens = 9
        bm.commit_full_blocks(request)
    assert a.block_ids[0] != b.block_ids[0]
    # b's second block chains on a's first (same content) and is found.
    assert bm.match_prefix([1, 2, 3, 4, 9, 9, 9, 9, 0]) == [a.block_ids[0], b.block_ids[1]]
    bm.audit([a.block_ids, b.block_ids])


def test_caching_disabled_never_matches() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    bm.free(_computed(bm, "a", list(range(9))))
    assert bm.match_prefix(list(range(9))) == []
    assert bm.num_cached_blocks == 0 and bm.num_prefix_hit_tokens == 0


def test_audit_detects_a_leak_and_bad_frees() -> None:
    bm = BlockManager(4, BS, enable_prefix_caching=True)
    request = _request("a", list(range(6)))
    assert bm.allocate(request, 6)
    with pytest.raises(RuntimeError, match="ref count"):
        bm.audit([])  # blocks held by nobody known: a leak
    stale = list(request.block_ids)
    bm.free(request)
    request.block_ids = stale
    with pytest.raises(RuntimeError, match="not owned"):
        bm.free(request)


def test_block_hash_is_stable_and_chained() -> None:
    root = block_hash(None, [1, 2, 3, 4])
    assert root == 15195315728730727403  # fixed across processes: names blocks across nodes
    assert block_hash(root, [5, 6, 7, 8]) == 15903411287830608657
    assert block_hash(root, [1, 2, 3, 4]) != root


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 4), (4, 0)])
def test_bad_sizes_are_refused(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match="num_blocks" if num_blocks == 0 else "block_size"):
        BlockManager(num_blocks, block_size, enable_prefix_caching=True)


def test_prefix_blocks_only_at_admission() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    cached = _computed(bm, "a", list(range(9)))
    request = _request("b", list(range(9)))
    assert bm.allocate(request, 1)
    with pytest.raises(ValueError, match="admission"):
        bm.allocate(request, 9, cached.block_ids[:2])
