"""Paged decode attention (Triton) against the dense torch oracle."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, DTYPES, LAYER, make_cache, poison_keys_before, tolerance

from engine.triton_kernels import paged_decode_attention, triton_available
from engine.triton_kernels.reference import decode_attention_ref

pytest.importorskip("triton")

HEAD_DIM = 16
KV_HEADS = 2


def test_triton_is_available_to_the_suite() -> None:
    assert triton_available()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_decode_matches_reference(
    group: int,
    block_size: int,
    num_splits: int | None,
    dtype: torch.dtype,
) -> None:
    lengths = [1, block_size - 1, block_size + 1, 3 * block_size + 2]
    cache = make_cache(lengths, block_size, KV_HEADS, HEAD_DIM, dtype)
    q = torch.randn(len(lengths), KV_HEADS * group, HEAD_DIM, device=DEVICE).to(dtype)
    scale = HEAD_DIM**-0.5
    args = (q, cache.kv, LAYER, cache.block_tables, cache.ctx_lens, scale)
    out = paged_decode_attention(*args, num_splits=num_splits)
    expected = decode_attention_ref(*args)
    assert out.dtype == q.dtype and out.shape == q.shape
    torch.testing.assert_close(out, expected, **tolerance(dtype))


def test_decode_reads_the_layer_it_is_given() -> None:
    cache = make_cache([5, 9], 4, KV_HEADS, HEAD_DIM, torch.float32)
    q = torch.randn(2, KV_HEADS, HEAD_DIM, device=DEVICE)
    other = cache.kv.clone()
    other[:, LAYER] = other[:, LAYER] * 2.0  # only this layer changes
    out = paged_decode_attention(q, cache.kv, LAYER, cache.block_tables, cache.ctx_lens, 0.25)
    changed = paged_decode_attention(q, other, LAYER, cache.block_tables, cache.ctx_lens, 0.25)
    assert not torch.allclose(out, changed)
    with pytest.raises(ValueError, match="layer"):
        paged_decode_attention(q, cache.kv, 7, cache.block_tables, cache.ctx_lens, 0.25)


def test_decode_rejects_heads_that_do_not_fit() -> None:
    cache = make_cache([3], 4, KV_HEADS, HEAD_DIM, torch.float32)
    q = torch.randn(1, KV_HEADS * 2 + 1, HEAD_DIM, device=DEVICE)
    with pytest.raises(ValueError, match="does not fit"):
        paged_decode_attention(q, cache.kv, LAYER, cache.block_tables, cache.ctx_lens, 0.25)


def test_decode_rejects_a_query_dtype_other_than_the_cache() -> None:
    cache = make_cache([3], 4, KV_HEADS, HEAD_DIM, torch.float32)
    q = torch.randn(1, KV_HEADS, HEAD_DIM, device=DEVICE, dtype=torch.float64)
    with pytest.raises(ValueError, match="dtype"):
        paged_decode_attention(q, cache.kv, LAYER, cache.block_tables, cache.ctx_lens, 0.25)


def test_decode_with_a_context_hint_matches_reference() -> None:
    lengths = [6, 13]
    cache = make_cache(lengths, 4, KV_HEADS, HEAD_DIM, torch.float32)
    q = torch.randn(2, KV_HEADS * 3, HEAD_DIM, device=DEVICE)
    args = (q, cache.kv, LAYER, cache.block_tables, cache.ctx_lens, 0.25)
    out = paged_decode_attention(*args, num_splits=2, max_ctx_len=max(lengths))
    torch.testing.assert_close(out, decode_attention_ref(*args), **tolerance(torch.float32))


@pytest.mark.parametrize("window", [0, 9])
def test_decode_planned_for_a_longer_context_matches_reference(window: int) -> None:
    """A CUDA graph plans the splits for the longest context its tables hold: each
    sequence's keys are still cut by its own length, and every one is read once."""
    lengths = [1, 6, 37, 130]
    cache = make_cache(lengths, 4, KV_HEADS, HEAD_DIM, torch.float32)
    q = torch.randn(len(lengths), KV_HEADS * 3, HEAD_DIM, device=DEVICE)
    scale = HEAD_DIM**-0.5
    args = (q, cache.kv, LAYER, cache.block_tables, cache.ctx_lens, scale)
    out = paged_decode_attention(*args, num_splits=4, max_ctx_len=4096, window=window)
    expected = decode_attention_ref(*args, window=window)
    torch.testing.assert_close(out, expected, **tolerance(torch.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("window", [1, 6, 23, 100])
def test_decode_sliding_window_matches_reference(
    window: int, num_splits: int | None, dtype: torch.dtype
) -> None:
    """Only the last ``window`` keys count; the ones before are NaN and must not be read."""
    lengths = [1, 5, 23, 41]
    cache = make_cache(lengths, 4, KV_HEADS, HEAD_DIM, dtype)
    q = torch.randn(len(lengths), KV_HEADS * 3, HEAD_DIM, device=DEVICE).to(dtype)
    scale = HEAD_DIM**-0.5
    poisoned = poison_keys_before(cache, [n - window for n in lengths])
    out = paged_decode_attention(
        q, poisoned, LAYER, cache.block_tables, cache.ctx_lens, scale, num_splits, window=window
    )
    expected = decode_attention_ref(
        q, cache.kv, LAYER, cache.block_tables, cache.ctx_lens, scale, window=window
    )
    torch.testing.assert_close(out, expected, **tolerance(dtype))


def test_decode_rejects_a_negative_window() -> None:
    cache = make_cache([3], 4, KV_HEADS, HEAD_DIM, torch.float32)
    q = torch.randn(1, KV_HEADS, HEAD_DIM, device=DEVICE)
    with pytest.raises(ValueError, match="window"):
        paged_decode_attention(
            q, cache.kv, LAYER, cache.block_tables, cache.ctx_lens, 0.25, window=-2
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("window", [0, 6])
def test_decode_with_attention_sinks_matches_reference(
    window: int, num_splits: int | None, dtype: torch.dtype
) -> None:
    """One logit per query head in each softmax's denominator (gpt-oss), counted once however
    many splits the keys are cut into, in and out of a sliding window; sinks large enough to
    take most of the weight change the answer."""
    lengths = [1, 5, 23, 41]
    cache = make_cache(lengths, 4, KV_HEADS, HEAD_DIM, dtype)
    q = torch.randn(len(lengths), KV_HEADS * 3, HEAD_DIM, device=DEVICE).to(dtype)
    sinks = torch.tensor([0.5, -1.0, 3.0, 0.0, 6.0, -4.0], device=DEVICE)
    args = (q, cache.kv, LAYER, cache.block_tables, cache.ctx_lens, HEAD_DIM**-0.5)
    out = paged_decode_attention(*args, num_splits, window=window, sinks=sinks)
    expected = decode_attention_ref(*args, window=window, sinks=sinks)
    torch.testing.assert_close(out, expected, **tolerance(dtype))
    plain = decode_attention_ref(*args, window=window)
    assert not torch.allclose(out.float(), plain.float(), atol=1e-2)


def test_decode_rejects_sinks_of_the_wrong_shape() -> None:
    cache = make_cache([3], 4, KV_HEADS, HEAD_DIM, torch.float32)
    q = torch.randn(1, KV_HEADS * 2, HEAD_DIM, device=DEVICE)
    with pytest.raises(ValueError, match="sinks"):
        paged_decode_attention(
            q, cache.kv, LAYER, cache.block_tables, cache.ctx_lens, 0.25,
            sinks=torch.zeros(3, device=DEVICE),
        )  # fmt: skip
