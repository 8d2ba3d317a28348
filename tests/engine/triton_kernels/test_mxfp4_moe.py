"""gpt-oss's MXFP4 experts in Triton (interpreted on the CPU) against the torch experts
path over the dequantized weights: the step's edge cases, biases and the clamped SwiGLU."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE
from moe_cases import CASES, mxfp4_case, random_routing

from engine.model.moe import experts_torch
from engine.model.specs import ClampedSwiglu

pytest.importorskip("triton")
from engine.triton_kernels.mxfp4_moe import mxfp4_moe

ACT = ClampedSwiglu(1.702, 1.5)


@pytest.mark.parametrize("case", ["one_token", "unused_experts", "no_tokens", "uneven_rows"])
def test_the_kernel_equals_the_torch_path(case: str) -> None:
    tokens, top_k, experts, chosen = CASES[case]
    w13, w2, biases = mxfp4_case(experts, 64, 32, seed=len(case))
    routing = random_routing(tokens, top_k, chosen, seed=len(case) + 1)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(2))
    want = experts_torch(x, w13, w2, routing, ACT, biases)
    moved = [t.to(DEVICE) for t in (x, *routing)]
    w13p, w2p = (type(w.packed)(*(t.to(DEVICE) for t in w.packed)) for w in (w13, w2))
    bias = tuple(b.to(DEVICE) for b in biases)
    got = mxfp4_moe(*moved, w13p, w2p, bias, ACT.alpha, ACT.limit)  # type: ignore[arg-type]
    torch.testing.assert_close(got.cpu(), want, atol=2e-4, rtol=2e-4)


def test_without_biases_and_with_wide_rows_equals_the_torch_path() -> None:
    w13, w2, _ = mxfp4_case(3, 96, 64, seed=3)
    routing = random_routing(5, 2, list(range(3)), seed=4)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(5))
    want = experts_torch(x, w13, w2, routing, ACT)
    moved = [t.to(DEVICE) for t in (x, *routing)]
    w13p, w2p = (type(w.packed)(*(t.to(DEVICE) for t in w.packed)) for w in (w13, w2))
    got = mxfp4_moe(*moved, w13p, w2p, None, ACT.alpha, ACT.limit)  # type: ignore[arg-type]
    torch.testing.assert_close(got.cpu(), want, atol=2e-4, rtol=2e-4)
