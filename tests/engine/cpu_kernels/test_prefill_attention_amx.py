"""Causal prefill attention on AMX tiles in bf16 products (prefill_attention_amx.c): against
float64 attention over the same bf16-rounded queries, keys and values, for grouped and plain
heads, head sizes of one to four tile steps, prompts of 1 to 300 tokens side by side, one and
two threads; shapes it does not take are declined."""

from __future__ import annotations

import math

import pytest
import torch

from engine.cpu_kernels.prefill_amx import prefill_attention_bf16, prompt_offsets
from tests.engine.cpu_kernels.amx_helpers import requires_amx

pytestmark = requires_amx
# the softmax weights are rounded to bf16 (2^-9) before P V: measured up to 1e-3 of the
# outputs' scale against this reference
TOLERANCE = 5e-3


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int], scale: float
) -> torch.Tensor:
    """float64 causal attention of each prompt over its own bf16-rounded (scaled) q, k, v."""
    group = q.shape[1] // k.shape[1]
    qb = (q * scale).bfloat16().double()
    kb = k.bfloat16().double().repeat_interleave(group, 1)
    vb = v.bfloat16().double().repeat_interleave(group, 1)
    outs, start = [], 0
    for n in lens:
        part = slice(start, start + n)
        s = torch.einsum("thd,shd->hts", qb[part], kb[part])
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        outs.append(torch.einsum("hts,shd->thd", torch.softmax(s, -1), vb[part]))
        start += n
    return torch.cat(outs)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "d", "lens"),
    [(9, 3, 64, [300]), (4, 2, 32, [1, 5, 40, 17]), (8, 8, 128, [100, 33]), (6, 1, 96, [16, 48])],
)
def test_against_float64_over_bf16_inputs(
    heads: int, kv_heads: int, d: int, lens: list[int], threads: int
) -> None:
    gen = torch.Generator().manual_seed(d + len(lens))
    tokens = sum(lens)
    q = torch.randn(tokens, heads, d, generator=gen)
    kv = torch.randn(tokens, 2, kv_heads, d, generator=gen)  # strided k and v, as qkv views
    k, v = kv[:, 0], kv[:, 1]
    starts = prompt_offsets(torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()]), tokens)
    scale = 1 / math.sqrt(d)
    got = prefill_attention_bf16(q, k, v, starts, scale)
    assert got is not None and got.shape == q.shape
    want = reference(q, k, v, lens, scale)
    assert float((got.double() - want).abs().max()) < TOLERANCE * float(want.abs().max())
    # a token sees only its own prompt's earlier tokens: changing a later token or another
    # prompt leaves it alone
    k2 = k.clone()
    k2[-1] += 1.0
    again = prefill_attention_bf16(q, k2, v, starts, scale)
    assert again is not None and torch.equal(again[:-1], got[:-1])


def test_declines_head_sizes_off_the_tile_steps() -> None:
    for d in (48, 288):
        q, k = torch.randn(8, 2, d), torch.randn(8, 1, d)
        offsets = prompt_offsets(torch.tensor([0, 8]), 8)
        assert prefill_attention_bf16(q, k, k.clone(), offsets, 0.1) is None


def test_refuses_offsets_that_miss_tokens() -> None:
    for bad in ([0, 5], [1, 8], [0, 4, 4, 8]):
        with pytest.raises(ValueError, match="offsets"):
            prompt_offsets(torch.tensor(bad), 8)
    q, k = torch.randn(8, 2, 32), torch.randn(8, 1, 32)
    with pytest.raises(ValueError, match="prompt_offsets"):
        prefill_attention_bf16(q, k, k.clone(), torch.tensor([0, 8]), 0.1)  # int64
