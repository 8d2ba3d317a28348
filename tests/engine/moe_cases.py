"""Shared cases for the MoE kernel tests (C and Triton): random experts and routings with the
edge cases a step produces."""

from __future__ import annotations

import torch

from engine.model.moe import Routing

# name: (tokens, top_k, experts, the experts the tokens may choose)
CASES: dict[str, tuple[int, int, int, list[int]]] = {
    "one_token": (1, 2, 8, list(range(8))),
    "top_1": (9, 1, 4, list(range(4))),
    "unused_experts": (11, 2, 7, [0, 3, 6]),
    "no_tokens": (0, 2, 4, list(range(4))),
    "many_rows_per_expert": (100, 2, 3, list(range(3))),
    "uneven_rows": (23, 3, 5, list(range(5))),
}


def random_experts(
    experts: int, hidden: int, inter: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """w13 [E, 2 I, H] and w2 [E, H, I] ~ N(0, 1 / fan_in)."""
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    return w13, w2


def random_routing(tokens: int, top_k: int, chosen: list[int], seed: int) -> Routing:
    """Distinct experts per token, drawn from ``chosen`` only (the others get no rows), and
    positive weights."""
    gen = torch.Generator().manual_seed(seed)
    picks = torch.rand(tokens, len(chosen), generator=gen).argsort(dim=1)[:, :top_k]
    return Routing(torch.rand(tokens, top_k, generator=gen), torch.tensor(chosen)[picks])
