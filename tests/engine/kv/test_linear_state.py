"""The linear-attention state pool: slots taken and given back, its bytes as the KV sizing
counts them, and the state record written into KV blocks and read back (one unit per KV
head, each rank's share of the state in the units of its heads), refused when it is not the
request's."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

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


def _replica(rank: int, store: str, stream: torch.Tensor, out: str) -> None:
    """Rank ``rank`` of two sharing the model's one KV head: its key head's share of
    ``stream`` in its slot, the record written into its own copy of the head's cells."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        part = pool(k_heads=Span(rank, 1), kv_heads=Span(0, 1), num_kv_heads=1)
        assert part.replicated
        half = len(stream) // 2
        unpack(part.spec, stream[rank * half : (rank + 1) * half], part.conv[0], part.recurrent[0])
        kv = kv_cache()[:, :, :, :, :1].clone()
        assert part.save(0, "a", list(range(part.record_blocks(128))), kv)
        torch.save(kv, out)
    finally:
        dist.destroy_process_group()


def test_replicas_of_a_kv_head_each_write_its_whole_unit(tmp_path: Path) -> None:
    """A model of one KV head over two ranks (each one key head): the ranks gather their
    shares, so whichever replica the transfer reads carries the whole state, and a pool of
    one rank, or either rank, reads it back."""
    whole = pool(kv_heads=Span(0, 1), num_kv_heads=1)
    slot = filled(whole)
    stream = pack(whole.spec, whole.conv[slot], whole.recurrent[slot])
    outs = [str(tmp_path / f"kv{rank}.pt") for rank in range(2)]
    context = multiprocessing.get_context("spawn")
    procs = [
        context.Process(target=_replica, args=(r, str(tmp_path / "store"), stream, outs[r]))
        for r in range(2)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    blocks = list(range(whole.record_blocks(128)))
    for out in outs:
        kv = torch.load(out)
        back = pool(kv_heads=Span(0, 1), num_kv_heads=1)
        assert back.load(0, "a", blocks, kv) is None
        assert torch.equal(back.conv[0], whole.conv[slot])
        assert torch.equal(back.recurrent[0], whole.recurrent[slot])
        second = pool(k_heads=Span(1, 1), kv_heads=Span(0, 1), num_kv_heads=1)
        assert second.load(0, "a", blocks, kv) is None
        assert torch.equal(second.recurrent[0], whole.recurrent[slot][:, 2:])
