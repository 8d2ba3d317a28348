"""The linear-attention state pool: slots taken and given back, its bytes as the KV sizing
counts them, and the state record written into KV blocks and read back (one unit per KV
head, each rank's share of the state in the units of its heads), refused when it is not the
request's."""

from __future__ import annotations

import pytest
import torch

from engine.kv.linear_state import Placement, StatePool, local_spec, pack, unpack
from engine.model.shard import Span
from engine.model.specs import LinearAttnSpec

SPEC = LinearAttnSpec(
    layers=(0, 2), num_k_heads=2, num_v_heads=4, k_head_dim=8, v_head_dim=4, conv_kernel=4
)
KV_HEADS = 2


def pool(slots: int = 2, dtype: torch.dtype = torch.float32, **place: object) -> StatePool:
    where = Placement(**{"kv_heads": Span(0, KV_HEADS), "num_kv_heads": KV_HEADS} | place)
    return StatePool(SPEC, slots, dtype, torch.device("cpu"), where)  # type: ignore[arg-type]


def kv_cache(blocks: int = 24) -> torch.Tensor:
    # [blocks, layers, planes, block_size, kv_heads, head_dim]: a head's cells are 128 bytes
    return torch.zeros(blocks, 2, 2, 2, KV_HEADS, 4)


def filled(states: StatePool, request_id: str = "a") -> int:
    slot = states.slot(request_id)
    states.conv[slot].normal_()
    states.recurrent[slot].normal_()
    return slot


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


def test_pack_orders_by_key_head_whatever_the_split() -> None:
    """A rank's packed share is its key heads' part of the whole model's packed slot."""
    whole = pool()
    slot = filled(whole)
    stream = pack(whole.spec, whole.conv[slot], whole.recurrent[slot])
    half = len(stream) // 2
    for rank in range(2):
        part = pool(k_heads=Span(rank, 1))
        assert part.spec == local_spec(SPEC, 1)
        unpack(part.spec, stream[rank * half : (rank + 1) * half], part.conv[0], part.recurrent[0])
        again = pack(part.spec, part.conv[0], part.recurrent[0])
        assert torch.equal(again, stream[rank * half : (rank + 1) * half])


def test_a_record_round_trips_through_blocks_and_names_what_is_wrong() -> None:
    source, target = pool(), pool()
    slot = filled(source)
    kv = kv_cache()
    n = source.record_blocks(128)
    blocks = torch.randperm(24)[:n].tolist()
    with pytest.raises(ValueError, match=f"takes {n} blocks"):
        source.save(slot, "a", blocks[:-1], kv)
    assert source.save(slot, "a", blocks, kv)
    assert target.load(0, "b", blocks, kv) == "another request's state"
    assert target.load(1, "a", blocks, kv) is None
    assert torch.equal(target.conv[1], source.conv[slot])
    assert torch.equal(target.recurrent[1], source.recurrent[slot])
    kv[blocks[-1], 1, 1, 1, 1, 3] += 1.0  # a payload byte of the last head's unit
    assert target.load(1, "a", blocks, kv) == "a corrupt state (checksum)"
    other = pool(1, torch.bfloat16)
    assert other.load(0, "a", blocks[: other.record_blocks(128)], kv) == (
        "a state of another shape"
    )


def test_each_rank_reads_its_share_from_its_heads_units() -> None:
    """Written by one pool of the whole state, read by two ranks each holding one key head
    and one KV head (the cells of that head only); and the other way round."""
    whole, kv = pool(), kv_cache()
    slot = filled(whole)
    blocks = list(range(whole.record_blocks(128)))
    assert whole.save(slot, "a", blocks, kv)
    halves = [pool(k_heads=Span(r, 1), kv_heads=Span(r, 1)) for r in range(2)]
    back = pool()
    rank_kv = [kv[:, :, :, :, r : r + 1].clone() for r in range(2)]
    for rank, part in enumerate(halves):
        assert part.load(0, "a", blocks, rank_kv[rank]) is None
        assert part.save(0, "a", blocks, rank_kv[rank])
    joined = torch.cat(rank_kv, dim=4)
    assert back.load(0, "a", blocks, joined) is None
    assert torch.equal(back.conv[0], whole.conv[slot])
    assert torch.equal(back.recurrent[0], whole.recurrent[slot])


def test_a_share_its_heads_do_not_carry_is_refused() -> None:
    """A model of one KV head, replicated over two ranks: the head's unit carries the first
    rank's share only, so the second rank refuses (its request is recomputed)."""
    kv = kv_cache()
    first = pool(k_heads=Span(0, 1), kv_heads=Span(0, 1), num_kv_heads=1)
    second = pool(k_heads=Span(1, 1), kv_heads=Span(0, 1), num_kv_heads=1)
    blocks = list(range(first.record_blocks(128)))
    one_head = kv[:, :, :, :, :1].clone()
    assert first.save(filled(first), "a", blocks, one_head)
    assert first.load(1, "a", blocks, one_head) is None
    assert "do not cover" in str(second.load(0, "a", blocks, one_head))
