from __future__ import annotations

import pytest

from kv_transfer import LeaseCounts, LeaseTable


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_table() -> tuple[LeaseTable, list[tuple[str, list[int]]], Clock]:
    freed: list[tuple[str, list[int]]] = []
    clock = Clock()
    return LeaseTable(lambda rid, blocks: freed.append((rid, blocks)), clock=clock), freed, clock


def test_release_frees_the_blocks_exactly_once() -> None:
    table, freed, _ = make_table()
    lease = table.grant("a", [4, 2, 9], ttl_s=5)
    assert lease.block_ids == (4, 2, 9) and lease.expires_at == 105.0
    assert table.held() == LeaseCounts(leases=1, blocks=3)
    assert table.release("a") is True
    assert table.release("a") is False
    assert freed == [("a", [4, 2, 9])]
    assert table.held() == LeaseCounts(0, 0)


def test_expire_frees_only_leases_past_their_expiry() -> None:
    table, freed, clock = make_table()
    table.grant("short", [1], ttl_s=1)
    table.grant("long", [2, 3], ttl_s=10)
    clock.now += 0.5
    assert table.expire() == []
    clock.now += 0.5
    assert table.expire() == ["short"]
    assert freed == [("short", [1])]
    assert table.release("short") is False  # an expired lease cannot be freed twice
    assert table.held() == LeaseCounts(1, 2)
    clock.now += 9
    assert table.expire() == ["long"]
    assert table.held() == LeaseCounts(0, 0)
    assert [rid for rid, _ in freed] == ["short", "long"]


def test_a_request_id_holds_one_lease_and_ttl_must_be_positive() -> None:
    table, _, _ = make_table()
    table.grant("a", [1], ttl_s=1)
    with pytest.raises(ValueError, match="already holds a lease"):
        table.grant("a", [2], ttl_s=1)
    with pytest.raises(ValueError, match="ttl_s"):
        table.grant("b", [2], ttl_s=0)
    assert table.get("a") is not None and table.get("b") is None


def test_on_free_may_call_back_into_the_table() -> None:
    seen: list[LeaseCounts] = []
    table = LeaseTable(lambda rid, blocks: seen.append(table.held()))
    table.grant("a", [1, 2], ttl_s=60)
    table.release("a")
    assert seen == [LeaseCounts(0, 0)]
