"""Shared cases for the MoE kernel tests (C and Triton): random experts and routings with the
edge cases a step produces."""

from __future__ import annotations

import torch

from engine.model.moe import Routing
from engine.model.quant.mxfp4 import Mxfp4Experts, quantize

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


def packed_experts(w: torch.Tensor) -> Mxfp4Experts:
    """``w`` [E, rows, cols] quantized to MXFP4 and held packed."""
    experts = Mxfp4Experts(*w.shape, torch.float32, "cpu")
    experts.blocks.data, experts.scales.data = quantize(w)
    return experts


def mxfp4_case(
    experts: int, hidden: int, inter: int, seed: int
) -> tuple[Mxfp4Experts, Mxfp4Experts, tuple[torch.Tensor, torch.Tensor]]:
    """gpt-oss-like experts packed as MXFP4 (values spread over the e2m1 codes) and random
    gate / up and down biases."""
    w13, w2 = random_experts(experts, hidden, inter, seed)
    gen = torch.Generator().manual_seed(seed + 100)
    biases = (
        torch.randn(experts, 2 * inter, generator=gen),
        torch.randn(experts, hidden, generator=gen),
    )
    return packed_experts(w13 * 4), packed_experts(w2 * 4), biases
