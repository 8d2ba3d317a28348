"""The import steps on plain numbers: which blocks move."""

from __future__ import annotations

import pytest

from cluster.protocol import KVHandle
from decode_node.importer import check_handle, transfer_pairs
from engine.scheduler.plan import ImportPlan
from node.errors import NodeError


def test_only_blocks_missing_from_the_local_cache_move() -> None:
    # 9 KV tokens in blocks of 4: the first block is cached here, blocks 2 and 3 move
    plan = ImportPlan(block_ids=(7, 8, 9), num_cached_tokens=4, num_kv_tokens=9, block_size=4)
    assert transfer_pairs(plan, [20, 21, 22]) == ([21, 22], [8, 9])


def test_a_fully_cached_prompt_moves_no_block() -> None:
    # 8 KV tokens, both blocks cached; block 9 (the next token's) is the request's own
    plan = ImportPlan(block_ids=(7, 8, 9), num_cached_tokens=8, num_kv_tokens=8, block_size=4)
    assert transfer_pairs(plan, [20, 21]) == ([], [])


def test_a_state_record_moves_from_the_last_blocks_to_the_last_blocks() -> None:
    # a hybrid model: 8 KV tokens (2 blocks), then the next token's block, then a record of
    # 2 blocks; the sender's table has its prompt's 2 blocks and its record's 2
    plan = ImportPlan(
        block_ids=(7, 8, 9, 10, 11), num_cached_tokens=0, num_kv_tokens=8, block_size=4,
        num_state_blocks=2,
    )  # fmt: skip
    assert transfer_pairs(plan, [20, 21, 30, 31]) == ([20, 21, 30, 31], [7, 8, 10, 11])


def test_kv_computed_under_another_adapter_is_refused_by_name() -> None:
    kv = KVHandle(
        node_id="p", peer_info="", block_ids=[1, 2], num_tokens=20, layout_fingerprint="f",
        lease_expires_at=0.0, lora_name="alpha",
    )  # fmt: skip
    check_handle(kv, 20, 16, "alpha")
    for other, named in (("beta", "beta"), (None, "none (base model)")):
        with pytest.raises(NodeError) as info:
            check_handle(kv, 20, 16, other)
        assert info.value.status == 400 and info.value.info.param == "kv.lora_name"
        assert "alpha" in str(info.value) and named in str(info.value)
