"""The Triton fused-MoE kernels equal the torch experts path (engine.model.moe) on the edge
cases a step produces (tests/engine/moe_cases.py), and the sorted order they read holds every
(token, slot) pair once, in blocks of one expert each."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, DTYPES, tolerance
from moe_cases import CASES, random_experts, random_routing

from engine.model.moe import Routing, experts_torch

pytest.importorskip("triton")

from engine.triton_kernels.fused_moe import align_by_expert, fused_moe


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_moe_equals_the_torch_path(case: str, activation: str) -> None:
    tokens, top_k, experts, chosen = CASES[case]
    h, i = 40, 24  # neither a multiple of the tiles
    w13, w2 = random_experts(experts, h, i, seed=len(case))
    routing = random_routing(tokens, top_k, chosen, seed=len(case) + 1)
    x = torch.randn(tokens, h, generator=torch.Generator().manual_seed(2))
    want = experts_torch(x, w13, w2, routing, activation)
    on = [t.to(DEVICE) for t in (x, w13, w2, *routing)]
    got = fused_moe(*on, activation, block_m=16)
    torch.testing.assert_close(got.cpu(), want, **tolerance(torch.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_moe_in_half_precision_dtypes(dtype: torch.dtype) -> None:
    w13, w2 = random_experts(4, 32, 32, seed=3)
    routing = random_routing(6, 2, list(range(4)), seed=4)
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(5))
    want = experts_torch(x, w13, w2, routing, "silu")
    on = [t.to(DEVICE, dtype) for t in (x, w13, w2)]
    got = fused_moe(*on, *(t.to(DEVICE) for t in routing), "silu")
    assert got.dtype == dtype
    torch.testing.assert_close(got.float().cpu(), want, **tolerance(dtype))


@pytest.mark.parametrize("block_m", [16, 64])
def test_alignment_holds_each_slot_once_in_single_expert_blocks(block_m: int) -> None:
    routing = random_routing(37, 3, [0, 2, 5, 6], seed=6)
    ids = routing.ids.to(DEVICE)
    align = align_by_expert(ids, num_experts=7, block_m=block_m)
    slots, experts = align.slots.cpu().long(), align.block_expert.cpu().long()
    n = ids.numel()
    real = slots[slots < n]
    assert sorted(real.tolist()) == list(range(n))  # every pair once, padding = n
    assert slots.numel() == experts.numel() * block_m
    flat = routing.ids.reshape(-1)
    for b, e in enumerate(experts.tolist()):
        rows = slots[b * block_m : (b + 1) * block_m]
        rows = rows[rows < n]
        if e < 0:
            assert rows.numel() == 0
        else:
            assert rows.numel() > 0 and bool((flat[rows] == e).all())
    assert sorted({e for e in experts.tolist() if e >= 0}) == [0, 2, 5, 6]


def test_bad_shapes_are_refused_by_name() -> None:
    w13, w2 = random_experts(4, 16, 16, seed=7)
    x = torch.randn(3, 16, device=DEVICE)
    r = Routing(torch.rand(3, 2, device=DEVICE), torch.zeros(3, 2, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="activation 'relu'"):
        fused_moe(x, w13.to(DEVICE), w2.to(DEVICE), *r, "relu")
    with pytest.raises(ValueError, match=r"\[E, 2 I, H\]"):
        fused_moe(x, w13.to(DEVICE), w2[:, :8].to(DEVICE), *r, "silu")
    with pytest.raises(ValueError, match=r"must be \[3, k\]"):
        fused_moe(x, w13.to(DEVICE), w2.to(DEVICE), r.weights[:2], r.ids[:2], "silu")
