"""The chained block hash the router computes from token ids."""

from __future__ import annotations

import pytest

from models.block_hash import adapter_hash_root, block_hash, prefix_block_hashes


def test_hashes_are_stable_across_processes() -> None:
    # Golden values: a change here breaks every node <-> router index in a mixed cluster.
    root = block_hash(None, [1, 2, 3, 4])
    assert block_hash(root, [5, 6, 7, 8]) == 15903411287830608657
    assert prefix_block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == [
        root,
        15903411287830608657,
    ]


def test_a_block_hash_depends_on_everything_before_it() -> None:
    a = prefix_block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = prefix_block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[0] != b[0] and a[1] != b[1]  # same second block, different first
    assert prefix_block_hashes([1, 2, 3], 4) == []
    with pytest.raises(ValueError, match="block_size"):
        prefix_block_hashes([1], 0)


def test_an_adapter_root_keys_every_block_and_is_stable() -> None:
    tokens = list(range(40))
    base = prefix_block_hashes(tokens, 16)
    alpha = prefix_block_hashes(tokens, 16, adapter_hash_root("alpha"))
    beta = prefix_block_hashes(tokens, 16, adapter_hash_root("beta"))
    assert len(alpha) == len(base) == 2
    assert not set(alpha) & set(base) and not set(alpha) & set(beta)
    assert alpha == prefix_block_hashes(tokens, 16, adapter_hash_root("alpha"))
    # golden: nodes and routers of one cluster must agree on it
    assert adapter_hash_root("alpha") == 0xFA988A3DE317C2A2
