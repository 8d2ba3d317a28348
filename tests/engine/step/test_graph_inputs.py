"""The decode graphs' buckets and input buffers: a step of d rows picks the smallest bucket
that holds it, its rows are copied in, and every row past them is padding that writes no KV
(PAD_SLOT), reads one key and runs under no adapter."""

from __future__ import annotations

import pytest
import torch

from engine.model.attention import AttentionMetadata
from engine.step.batch import StepInputs
from engine.step.graph_inputs import NO_ADAPTER, GraphInputs, bucket_for, capture_sizes
from engine.step.graphs import graph_reserve
from engine.triton_kernels import PAD_SLOT


def test_capture_sizes_are_vllms_buckets_up_to_the_batch() -> None:
    assert capture_sizes(256) == (1, 2, 4, *range(8, 257, 8))
    assert capture_sizes(300)[-4:] == (256, 272, 288, 300)  # every 16 past 256, then the top
    assert capture_sizes(1) == (1,)
    assert capture_sizes(5) == (1, 2, 4, 5)
    assert capture_sizes(64)[-2:] == (56, 64)
    with pytest.raises(ValueError, match="max_rows >= 1, got 0"):
        capture_sizes(0)


@pytest.mark.parametrize(
    ("rows", "bucket"), [(1, 1), (3, 4), (4, 4), (5, 8), (9, 16), (64, 64), (65, None)]
)
def test_a_step_takes_the_smallest_bucket_that_holds_it(rows: int, bucket: int | None) -> None:
    assert bucket_for(capture_sizes(64), rows) == bucket


def test_no_bucket_for_an_empty_step() -> None:
    assert bucket_for(capture_sizes(64), 0) is None


def test_graph_memory_reserve_counts_the_largest_and_each_other_graph() -> None:
    assert graph_reserve(300 << 20, 2 << 20, 35) == (300 << 20) + 34 * (2 << 20)
    assert graph_reserve(300, 0, 1) == 300
    assert graph_reserve(300, -5, 3) == 300  # a reading that went down counts nothing


def _step(slots: list[int], starts: list[int], tables: list[list[int]], lora: bool) -> StepInputs:
    """A plain decode step of len(slots) rows, as the persistent batch builds it."""
    d = len(slots)
    meta = AttentionMetadata(
        num_decodes=d,
        query_lens=(1,) * d,
        context_lens_host=tuple(s + 1 for s in starts),
        block_size=4,
        positions=torch.tensor(starts),
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.arange(d + 1, dtype=torch.int32),
        context_lens=torch.tensor([s + 1 for s in starts], dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
    )
    ids = torch.arange(10, 10 + d)
    batch = None
    if lora:
        from engine.lora.delta import LoraBatch

        batch = LoraBatch(torch.tensor([0, -1, 1][:d]), (0, 1))
    return StepInputs(ids, meta, torch.arange(d), None, batch, plain_decode=True)


def test_rows_are_copied_and_rows_past_them_are_padding() -> None:
    inputs = GraphInputs(8, 6, 4, torch.device("cpu"), lora=True)
    assert inputs.slot_mapping.eq(PAD_SLOT).all()  # all padding before the first step
    three = _step([17, 9, 40], [5, 1, 8], [[4, 5], [2, 0], [10, 11]], True)
    assert inputs.load(three) == 3
    assert inputs.slot_mapping.tolist() == [17, 9, 40] + [PAD_SLOT] * 5
    assert inputs.context_lens.tolist() == [6, 2, 9] + [1] * 5
    assert inputs.positions[:3].tolist() == [5, 1, 8]
    assert inputs.input_ids[:3].tolist() == [10, 11, 12]
    assert inputs.block_tables[:3, :2].tolist() == [[4, 5], [2, 0], [10, 11]]
    assert inputs.token_slots is not None
    assert inputs.token_slots.tolist() == [0, -1, 1] + [NO_ADAPTER] * 5
    one = _step([21], [6], [[5, 5]], False)
    inputs.load(one)
    # the rows the step before held are padding again: no KV write, one key, no adapter
    assert inputs.slot_mapping.tolist() == [21] + [PAD_SLOT] * 7
    assert inputs.context_lens.tolist() == [7] + [1] * 7
    assert inputs.token_slots.tolist() == [NO_ADAPTER] * 8


def test_only_plain_decode_steps_are_loaded() -> None:
    inputs = GraphInputs(2, 6, 4, torch.device("cpu"), lora=False)
    step = _step([1, 2, 3], [0, 1, 2], [[0]] * 3, False)
    with pytest.raises(ValueError, match="at most 2 rows"):
        inputs.load(step)  # wider than the buffers
    with pytest.raises(ValueError, match="not a plain decode step"):
        inputs.load(step._replace(plain_decode=False))


def test_capture_metadata_plans_for_the_longest_context() -> None:
    """The attention's splits are planned once, at capture, for the longest context the
    tables hold: the replayed graph serves any context up to it."""
    inputs = GraphInputs(8, 6, 4, torch.device("cpu"), lora=False)
    meta = inputs.meta(4)
    assert meta.num_decodes == meta.num_tokens == 4
    assert meta.context_lens_host == (24,) * 4
    assert meta.decode_block_tables.shape == (4, 6)
    assert meta.slot_mapping.data_ptr() == inputs.slot_mapping.data_ptr()  # views: replayed
