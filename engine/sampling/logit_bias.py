"""OpenAI's `logit_bias`: a per-request additive bias on chosen token ids, applied to the
logits before penalties, filters and the draw (a bias of -100 keeps a token out, greedy
rows included)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from models.sampling_params import SamplingParams


class BiasEntries(NamedTuple):
    """The biases of one step's rows, flattened: entry j adds biases[j] to
    logits[positions[j], token_ids[j]]."""

    positions: torch.Tensor  # int64 [e]
    token_ids: torch.Tensor  # int64 [e]
    biases: torch.Tensor  # float32 [e]


def bias_entries(
    params: Sequence[SamplingParams | None], device: torch.device
) -> BiasEntries | None:
    """The entries of the rows whose params carry a logit_bias (row i = params[i])."""
    positions: list[int] = []
    token_ids: list[int] = []
    biases: list[float] = []
    for i, p in enumerate(params):
        if p is not None:
            for token, bias in p.logit_bias:
                positions.append(i)
                token_ids.append(token)
                biases.append(bias)
    if not positions:
        return None
    return BiasEntries(
        torch.tensor(positions, dtype=torch.int64, device=device),
        torch.tensor(token_ids, dtype=torch.int64, device=device),
        torch.tensor(biases, dtype=torch.float32, device=device),
    )


def apply_logit_bias(logits: torch.Tensor, entries: BiasEntries | None) -> torch.Tensor:
    """logits: [n, vocab] float32, not modified; a biased copy when there are entries."""
    if entries is None:
        return logits
    return logits.index_put((entries.positions, entries.token_ids), entries.biases, accumulate=True)
