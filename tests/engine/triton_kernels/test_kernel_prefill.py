"""Paged prefill attention (Triton) against the dense torch oracle, and against decode."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, DTYPES, LAYER, make_cache, poison_keys_before, tolerance

from engine.triton_kernels import paged_decode_attention, paged_prefill_attention
from engine.triton_kernels.reference import prefill_attention_ref

pytest.importorskip("triton")

HEAD_DIM = 16


def _cu(q_lens: list[int]) -> torch.Tensor:
    """Query start offsets [batch + 1] int32."""
    return torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)


def _cases(block_size: int) -> dict[str, tuple[list[int], list[int]]]:
    """name -> (new tokens per sequence, context lengths incl. the new tokens)."""
    bs = block_size
    return {
        "fresh": ([5, 1, bs + 1, 17], [5, 1, bs + 1, 17]),
        "cached_prefix": ([3, 1, bs - 1, 18], [bs + 3, 2 * bs + 1, 3 * bs - 1, 18 + bs]),
    }


# Long enough for several query and key tiles (16 x 16 under the interpreter), odd lengths.
WINDOW_Q_LENS, WINDOW_CTX_LENS = [37, 1, 9], [37, 30, 50]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["fresh", "cached_prefix"])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_prefill_matches_reference(
    group: int, block_size: int, case: str, dtype: torch.dtype
) -> None:
    q_lens, ctx_lens = _cases(block_size)[case]
    kv_heads = 2 if group < 8 else 1
    cache = make_cache(ctx_lens, block_size, kv_heads, HEAD_DIM, dtype)
    q = torch.randn(sum(q_lens), kv_heads * group, HEAD_DIM, device=DEVICE).to(dtype)
    cu_q = _cu(q_lens).to(DEVICE)
    args = (q, cache.kv, LAYER, cu_q, cache.ctx_lens, cache.block_tables, HEAD_DIM**-0.5)
    out = paged_prefill_attention(*args)
    assert out.dtype == q.dtype and out.shape == q.shape
    torch.testing.assert_close(out, prefill_attention_ref(*args), **tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [1, 7, 20, 64])
@pytest.mark.parametrize("group", [1, 3])
def test_prefill_sliding_window_matches_reference(
    group: int, window: int, dtype: torch.dtype
) -> None:
    """Windows below a tile, across tiles, and past every context (then full attention);
    keys below the first query's window are NaN in the cache and must never be read."""
    cache = make_cache(WINDOW_CTX_LENS, 4, 2, HEAD_DIM, dtype)
    q = torch.randn(sum(WINDOW_Q_LENS), 2 * group, HEAD_DIM, device=DEVICE).to(dtype)
    cu_q = _cu(WINDOW_Q_LENS).to(DEVICE)
    scale = HEAD_DIM**-0.5
    first_query = [c - n for n, c in zip(WINDOW_Q_LENS, WINDOW_CTX_LENS, strict=True)]
    poisoned = poison_keys_before(cache, [p - window + 1 for p in first_query])
    out = paged_prefill_attention(
        q, poisoned, LAYER, cu_q, cache.ctx_lens, cache.block_tables, scale, window=window
    )
    expected = prefill_attention_ref(
        q, cache.kv, LAYER, cu_q, cache.ctx_lens, cache.block_tables, scale, window=window
    )
    torch.testing.assert_close(out, expected, **tolerance(dtype))


def test_prefill_window_past_the_context_is_full_attention() -> None:
    cache = make_cache(WINDOW_CTX_LENS, 4, 2, HEAD_DIM, torch.float32)
    q = torch.randn(sum(WINDOW_Q_LENS), 4, HEAD_DIM, device=DEVICE)
    args = (q, cache.kv, LAYER, _cu(WINDOW_Q_LENS).to(DEVICE), cache.ctx_lens)
    full = paged_prefill_attention(*args, cache.block_tables, 0.25)
    wide = paged_prefill_attention(*args, cache.block_tables, 0.25, window=max(WINDOW_CTX_LENS))
    torch.testing.assert_close(wide, full, atol=0, rtol=0)


def test_prefill_window_of_one_returns_each_tokens_own_value() -> None:
    q_lens, ctx_lens = [5, 3], [5, 9]
    cache = make_cache(ctx_lens, 4, 1, HEAD_DIM, torch.float32)
    q = torch.randn(8, 2, HEAD_DIM, device=DEVICE)
    cu_q = _cu(q_lens).to(DEVICE)
    out = paged_prefill_attention(
        q, cache.kv, LAYER, cu_q, cache.ctx_lens, cache.block_tables, 0.25, window=1
    )
    for b, (n, ctx) in enumerate(zip(q_lens, ctx_lens, strict=True)):
        pos = torch.arange(ctx - n, ctx, device=DEVICE)
        blocks = cache.block_tables[b].long()[pos // 4]
        own_v = cache.kv[blocks, LAYER, 1, pos % 4]  # [n, 1, d]
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        torch.testing.assert_close(out[rows], own_v.expand(-1, 2, -1), atol=1e-6, rtol=0)


def test_prefill_last_row_equals_decode_of_that_token() -> None:
    """A prompt's last token sees the same keys in both kernels, so the rows agree."""
    q_lens, ctx_lens = [7, 2], [7, 11]
    cache = make_cache(ctx_lens, 4, 2, HEAD_DIM, torch.float32)
    q = torch.randn(sum(q_lens), 6, HEAD_DIM, device=DEVICE)
    cu_q = _cu(q_lens).to(DEVICE)
    scale = HEAD_DIM**-0.5
    last_rows = cu_q[1:].long() - 1
    for window in (0, 5):
        prefill = paged_prefill_attention(
            q, cache.kv, LAYER, cu_q, cache.ctx_lens, cache.block_tables, scale, 7, window
        )
        decode = paged_decode_attention(
            q[last_rows], cache.kv, LAYER, cache.block_tables, cache.ctx_lens, scale,
            window=window,
        )  # fmt: skip
        torch.testing.assert_close(prefill[last_rows], decode, atol=2e-5, rtol=1e-5)


def test_prefill_rejects_offsets_of_the_wrong_length() -> None:
    cache = make_cache([4, 4], 4, 2, HEAD_DIM, torch.float32)
    q = torch.randn(8, 2, HEAD_DIM, device=DEVICE)
    cu_q = _cu([4, 4])[:2].to(DEVICE)
    with pytest.raises(ValueError, match="cu_q"):
        paged_prefill_attention(q, cache.kv, LAYER, cu_q, cache.ctx_lens, cache.block_tables, 0.25)


def test_prefill_rejects_a_negative_window() -> None:
    cache = make_cache([4], 4, 1, HEAD_DIM, torch.float32)
    q = torch.randn(4, 1, HEAD_DIM, device=DEVICE)
    with pytest.raises(ValueError, match="window"):
        paged_prefill_attention(
            q, cache.kv, LAYER, _cu([4]).to(DEVICE), cache.ctx_lens, cache.block_tables, 0.25,
            window=-1,
        )  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [0, 7, 20])
def test_prefill_with_attention_sinks_matches_reference(window: int, dtype: torch.dtype) -> None:
    """One logit per query head in each row's softmax denominator (gpt-oss), over several
    query and key tiles, in and out of a sliding window, grouped heads."""
    cache = make_cache(WINDOW_CTX_LENS, 4, 2, HEAD_DIM, dtype)
    q = torch.randn(sum(WINDOW_Q_LENS), 6, HEAD_DIM, device=DEVICE).to(dtype)
    sinks = torch.tensor([0.5, -1.0, 3.0, 0.0, 6.0, -4.0], device=DEVICE)
    cu_q = _cu(WINDOW_Q_LENS).to(DEVICE)
    args = (q, cache.kv, LAYER, cu_q, cache.ctx_lens, cache.block_tables, HEAD_DIM**-0.5)
    out = paged_prefill_attention(*args, window=window, sinks=sinks)
    expected = prefill_attention_ref(*args, window=window, sinks=sinks)
    torch.testing.assert_close(out, expected, **tolerance(dtype))
    plain = prefill_attention_ref(*args, window=window)
    assert not torch.allclose(out.float(), plain.float(), atol=1e-2)


def test_prefill_last_row_with_sinks_equals_decode_of_that_token() -> None:
    q_lens, ctx_lens = [9], [21]
    cache = make_cache(ctx_lens, 4, 2, HEAD_DIM, torch.float32)
    q = torch.randn(9, 4, HEAD_DIM, device=DEVICE)
    sinks = torch.tensor([1.0, -2.0, 0.5, 4.0], device=DEVICE)
    tail = (cache.ctx_lens, cache.block_tables, 0.25)
    out = paged_prefill_attention(q, cache.kv, LAYER, _cu(q_lens).to(DEVICE), *tail, sinks=sinks)
    last = paged_decode_attention(
        q[-1:], cache.kv, LAYER, cache.block_tables, cache.ctx_lens, 0.25, sinks=sinks
    )
    torch.testing.assert_close(out[-1:], last, atol=1e-5, rtol=1e-5)
