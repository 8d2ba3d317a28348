"""The C prefill attention kernel (engine.cpu_kernels.prefill) against float64 attention (to
fp32 accumulation error):
causal chunks with and without a cached prefix, grouped heads, several sequences in one call,
chunk lengths around the kernel's tiles (64 keys, 96 rows), block sizes from 1 to 128, sliding
windows and soft-caps, an int8 cache, and both vector widths (the other one in a child)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from engine import cpu_kernels
from engine.cpu_kernels.build import WIDTH_ENV
from engine.kv_format.rows import dequantize_rows, quantize_rows, row_width, write_kv
from engine.model.attention import AttentionMetadata

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the CPU kernels need a C compiler (cc or $CC)"
)


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int, cap: float
) -> torch.Tensor:
    """Float64 attention of the last q.shape[0] positions of k, v ([ctx, kv_heads, d])."""
    n, ctx, group = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    kd, vd = (x.double().repeat_interleave(group, dim=1) for x in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q.double(), kd) * scale
    if cap:
        scores = cap * torch.tanh(scores / cap)
    pos = torch.arange(ctx - n, ctx)[:, None]
    keys = torch.arange(ctx)[None, :]
    seen = keys <= pos
    if window:
        seen &= keys > pos - window
    probs = scores.masked_fill(~seen, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, vd)


def run(
    seqs: list[tuple[int, int]],
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    window: int = 0,
    cap: float = 0.0,
    kv_dtype: str = "auto",
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kernel output, float64 expectation) for sequences given as (context, cached prefix),
    their blocks scattered over the cache; this step's K/V are written before the call. A
    quantized cache's expectation reads the dequantised rows where the kernel reads the cache
    (a sequence with a cached prefix), the fresh K/V elsewhere."""
    gen = torch.Generator().manual_seed(seed)
    blocks = sum(-(-c // block_size) for c, _ in seqs) + 3
    dtype = torch.float32 if kv_dtype == "auto" else torch.int8
    kv = torch.zeros(blocks, 2, 2, block_size, kv_heads, row_width(head_dim, kv_dtype), dtype=dtype)
    free = torch.randperm(blocks, generator=gen).tolist()
    tables, qs, ks, vs, want = [], [], [], [], []
    for ctx, prefix in seqs:
        table = [free.pop() for _ in range(-(-ctx // block_size))]
        q = torch.randn(ctx, heads, head_dim, generator=gen)
        k = torch.randn(ctx, kv_heads, head_dim, generator=gen) * 2
        v = torch.randn(ctx, kv_heads, head_dim, generator=gen)
        if prefix:
            meta = AttentionMetadata.build([prefix], [0], [table], block_size)
            write_kv(kv, 1, k[:prefix], v[:prefix], meta.slot_mapping)
        tables.append(table)
        qs.append(q[prefix:])
        ks.append(k[prefix:])
        vs.append(v[prefix:])
        if kv_dtype != "auto" and prefix:
            k, v = (dequantize_rows(quantize_rows(x, kv_dtype), torch.float32) for x in (k, v))
        want.append(reference(q[prefix:], k, v, head_dim**-0.5, window, cap))
    meta = AttentionMetadata.build(
        [c - p for c, p in seqs], [p for _, p in seqs], tables, block_size
    )
    k_step, v_step = torch.cat(ks), torch.cat(vs)
    write_kv(kv, 1, k_step, v_step, meta.slot_mapping)
    out = cpu_kernels.paged_prefill_attention(
        torch.cat(qs), k_step, v_step, kv, 1, meta.query_start_loc, meta.context_lens,
        meta.block_tables, head_dim**-0.5, window, cap,
    )  # fmt: skip
    return out, torch.cat(want)


# (context, cached prefix): fresh prompts of 1, 64, 65 and 200 tokens, chunks after prefixes
# that end mid-block and on a block boundary, a one-token chunk, a chunk longer than a tile
SEQS = [(1, 0), (65, 0), (70, 33), (17, 16), (64, 0), (230, 100), (200, 0)]


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size"),
    [(9, 3, 64, 16), (4, 4, 16, 1), (8, 1, 128, 128), (6, 3, 96, 7), (32, 1, 32, 16)],
)
def test_causal_chunks_equal_float64(
    threads: int, heads: int, kv_heads: int, head_dim: int, block_size: int
) -> None:
    out, want = run(SEQS, heads, kv_heads, head_dim, block_size)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("window", "cap"), [(7, 0.0), (0, 2.0), (37, 1.5), (64, 0.0)])
def test_windows_and_softcap_equal_float64(threads: int, window: int, cap: float) -> None:
    out, want = run(SEQS, 6, 2, 64, 16, window, cap, seed=1)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_int8_cache_reads_dequantised_rows_and_fresh_prompts_their_own(threads: int) -> None:
    out, want = run(SEQS, 9, 3, 64, 16, kv_dtype="int8", seed=2)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    exact, _ = run(SEQS, 9, 3, 64, 16, seed=2)
    fresh = slice(0, 1 + 65)  # the first two prompts have no cached prefix: exact answers
    torch.testing.assert_close(out[fresh], exact[fresh], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, exact, atol=1e-4)  # the cached prefixes were quantised


def test_window_never_reads_keys_behind_it() -> None:
    """Blocks wholly behind every query's window may be back in the pool: NaN there leaves
    the answer untouched."""
    gen = torch.Generator().manual_seed(3)
    ctx, prefix, window, bs = 40, 30, 6, 4  # queries at 30..39 see keys from 25 on
    kv = torch.randn(12, 1, 2, bs, 1, 16, generator=gen)
    table = torch.tensor([list(range(10))], dtype=torch.int32)
    k = kv[:10, 0, 0].reshape(-1, 1, 16)
    v = kv[:10, 0, 1].reshape(-1, 1, 16)
    q = torch.randn(ctx - prefix, 2, 16, generator=gen)
    want = reference(q, k, v, 0.25, window, 0.0)
    kv[:6] = float("nan")  # blocks 0-5: keys 0..23
    qsl = torch.tensor([0, ctx - prefix], dtype=torch.int32)
    lens = torch.tensor([ctx], dtype=torch.int32)
    got = cpu_kernels.paged_prefill_attention(
        q, k[prefix:], v[prefix:], kv, 0, qsl, lens, table, 0.25, window
    )
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_bad_offsets_and_short_tables_are_refused() -> None:
    kv = torch.zeros(4, 1, 2, 4, 1, 16)
    q, k = torch.zeros(5, 2, 16), torch.zeros(5, 1, 16)
    table = torch.zeros(1, 2, dtype=torch.int32)
    qsl = torch.tensor([0, 5], dtype=torch.int32)
    call = cpu_kernels.paged_prefill_attention
    with pytest.raises(ValueError, match="block table"):
        call(q, k, k, kv, 0, qsl, torch.tensor([9], dtype=torch.int32), table, 1.0)
    with pytest.raises(ValueError, match="shorter than its chunk"):
        call(q, k, k, kv, 0, qsl, torch.tensor([4], dtype=torch.int32), table, 1.0)
    with pytest.raises(ValueError, match="query offsets"):
        call(q, k, k, kv, 0, torch.tensor([0, 4], dtype=torch.int32), qsl[1:], table, 1.0)


CHECK = """
import sys
sys.path.insert(0, {here!r})
import torch
from engine import cpu_kernels
from test_prefill_attention import SEQS, run
assert cpu_kernels.vec_width() == {width}, cpu_kernels.vec_width()
for args in [(9, 3, 64, 16, 0, 0.0), (6, 2, 96, 5, 37, 1.5), (4, 4, 16, 1, 0, 0.0)]:
    out, want = run(SEQS, *args)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
out, want = run(SEQS, 9, 3, 64, 16, kv_dtype="int8")
torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
print("ok")
"""


@pytest.mark.parametrize("width", [8, 16])
def test_each_vector_width_equals_float64(width: int) -> None:
    env = dict(os.environ, **{WIDTH_ENV: str(width)})
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run(
        [sys.executable, "-c", CHECK.format(here=here, width=width)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_a_shared_index_gives_the_same_answer_and_must_match_the_call() -> None:
    torch.manual_seed(0)
    kv = torch.randn(4, 2, 2, 4, 1, 16)
    q, k, v = torch.randn(5, 2, 16), torch.randn(5, 1, 16), torch.randn(5, 1, 16)
    table = torch.tensor([[1, 2]], dtype=torch.int32)
    qsl, lens = torch.tensor([0, 5], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    call = cpu_kernels.paged_prefill_attention
    want = call(q, k, v, kv, 1, qsl, lens, table, 0.25)
    index = cpu_kernels.prefill_index(qsl, lens, table, 5, 4)
    got = call(q, k, v, kv, 1, qsl, lens, table, 0.25, index=index)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    with pytest.raises(ValueError, match="index for 4 tokens"):
        call(q, k, v, kv, 1, qsl, lens, table, 0.25, index=index.__class__(qsl, lens, table, 4, 4))
