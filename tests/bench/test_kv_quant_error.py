"""bench.kv_quant_error on synthetic records: exact schemes score 0, rounding schemes rank as
their precision says, and the RoPE-pair tables give both channels of a pair one scale."""

from __future__ import annotations

import torch

from bench.kv_quant_error import Record, _pair_max, schemes, score_error


def _record() -> tuple[Record, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    rec: Record = {}
    for layer in range(2):
        prompts = []
        for t in (5, 9):
            q = torch.randn(t, 4, 8, generator=gen)  # [tokens, heads, d]: 2 kv heads, group 2
            k = torch.randn(t, 2, 8, generator=gen)
            k[..., 3] += 10.0  # an offset channel
            prompts.append((q, k))
        rec[layer] = prompts
    return rec, [torch.randn(16, 12, generator=gen) for _ in range(2)]


def test_exact_scheme_scores_zero_and_precisions_rank() -> None:
    rec, wks = _record()
    assert score_error(rec, lambda _, k: k, 2) == 0.0
    errors = {name: score_error(rec, s, 2) for name, s in schemes(rec, wks, 2).items()}
    plain, rotated = (
        errors["int8 rows, keys as they are"],
        errors["int8 rows, keys rotated (the cache)"],
    )
    assert 0 < errors["bf16"] < plain < errors["fp8_e4m3 rows (the cache)"]
    assert errors["bf16"] < rotated < errors["fp8_e4m3 rows (the cache)"]
    assert all(e > 0 for e in errors.values())


def test_pair_tables_share_a_scale_per_rope_pair() -> None:
    x = torch.tensor([[1.0, 5.0, 3.0, 2.0]])
    assert _pair_max(x).tolist() == [[3.0, 5.0, 3.0, 5.0]]
