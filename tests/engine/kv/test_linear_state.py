"""The linear-attention state pool: slots taken and given back, its bytes as the KV sizing
counts them, and the state record written into KV blocks and read back, refused when it is
not the request's."""

from __future__ import annotations

import pytest
import torch

from engine.kv.linear_state import StatePool
from engine.model.specs import LinearAttnSpec

SPEC = LinearAttnSpec(
    layers=(0, 2), num_k_heads=2, num_v_heads=4, k_head_dim=8, v_head_dim=4, conv_kernel=4
)


def pool(slots: int = 2) -> StatePool:
    return StatePool(SPEC, slots, torch.float32, torch.device("cpu"))


def test_slots_are_taken_once_and_given_back() -> None:
    states = pool()
    assert states.slot("a") == states.slot("a")
    states.slot("b")
    assert states.num_free == 0
    with pytest.raises(RuntimeError, match="state pool is full"):
        states.slot("c")
    states.release("a")
    states.release("a")  # a second release is a no-op
    assert states.num_free == 1 and not states.holds("a")


def test_the_sizing_counts_what_the_pool_allocates() -> None:
    states = pool(3)
    allocated = sum(t.numel() * t.element_size() for t in (states.conv, states.recurrent))
    assert StatePool.cache(SPEC, 3, torch.float32).fixed_bytes == allocated


def test_a_record_round_trips_through_blocks_and_names_what_is_wrong() -> None:
    source, target = pool(), pool()
    slot = source.slot("a")
    source.conv[slot].normal_()
    source.recurrent[slot].normal_()
    kv = torch.zeros(16, 64)  # blocks of 256 bytes
    n = source.record_blocks(256)
    blocks = torch.randperm(16)[:n].tolist()
    with pytest.raises(ValueError, match=f"takes {n} blocks"):
        source.save("a", blocks[:-1], kv)
    source.save("a", blocks, kv)
    assert target.load("b", blocks, kv) == "another request's state"
    assert not target.holds("b")
    assert target.load("a", blocks, kv) is None
    got = target.slot("a")
    assert torch.equal(target.conv[got], source.conv[slot])
    assert torch.equal(target.recurrent[got], source.recurrent[slot])
    kv[blocks[-1], 0] += 1.0
    assert target.load("a", blocks, kv) == "a corrupt state (checksum)"
    other = StatePool(SPEC, 1, torch.bfloat16, torch.device("cpu"))
    assert other.load("a", blocks[: other.record_blocks(256)], kv) == "a state of another shape"
