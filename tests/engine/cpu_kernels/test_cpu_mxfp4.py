"""The C kernel for gpt-oss's experts over packed MXFP4 weights equals the torch experts
path (the weights dequantized) on the edge cases a step produces (tests/engine/moe_cases.py),
with the biases and the clamped SwiGLU; bad shapes are refused by name."""

from __future__ import annotations

import pytest
import torch
from moe_cases import CASES, mxfp4_case, packed_experts, random_routing

from engine import cpu_kernels
from engine.cpu_kernels.mxfp4 import Mxfp4Tensors, fused_mxfp4_experts
from engine.model.moe import experts_torch
from engine.model.quant.mxfp4 import Mxfp4Experts
from engine.model.specs import ClampedSwiglu

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the CPU kernels need a C compiler (cc or $CC)"
)
ACT = ClampedSwiglu(1.702, 1.5)  # a clamp low enough to bite


@pytest.mark.parametrize("case", list(CASES))
def test_the_kernel_equals_the_torch_path(case: str) -> None:
    tokens, top_k, experts, chosen = CASES[case]
    w13, w2, biases = mxfp4_case(experts, 64, 32, seed=len(case))
    routing = random_routing(tokens, top_k, chosen, seed=len(case) + 1)
    wide = torch.randn(tokens, 96, generator=torch.Generator().manual_seed(2))
    x = wide[:, 16:80]  # a row stride other than H
    want = experts_torch(x, w13, w2, routing, ACT, biases)
    got = fused_mxfp4_experts(x, *routing, w13.packed, w2.packed, biases, ACT.alpha, ACT.limit)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
    if tokens:
        plain = experts_torch(x, w13, w2, routing, ACT)
        assert not torch.allclose(got, plain, atol=1e-2)  # the biases count
        unclamped = ClampedSwiglu(ACT.alpha, 100.0)
        assert not torch.allclose(got, experts_torch(x, w13, w2, routing, unclamped, biases))


def test_a_large_step_equals_the_torch_path() -> None:
    """Enough rows that every pass is shared out between threads, and widths of several
    scale blocks."""
    w13, w2, biases = mxfp4_case(4, 256, 96, seed=13)
    routing = random_routing(200, 2, list(range(4)), seed=14)
    x = torch.randn(200, 256, generator=torch.Generator().manual_seed(15))
    want = experts_torch(x, w13, w2, routing, ACT, biases)
    got = fused_mxfp4_experts(x, *routing, w13.packed, w2.packed, biases, ACT.alpha, ACT.limit)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def test_without_biases_equals_the_torch_path() -> None:
    w13, w2, _ = mxfp4_case(3, 32, 64, seed=3)
    routing = random_routing(5, 2, list(range(3)), seed=4)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(5))
    want = experts_torch(x, w13, w2, routing, ACT)
    got = fused_mxfp4_experts(x, *routing, w13.packed, w2.packed, None, ACT.alpha, ACT.limit)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def test_every_code_and_extreme_scales_decode_as_the_format_says() -> None:
    """One expert whose gate / up rows hold each of the 16 codes at scales from 2^-20 to
    2^20 (an identity down projection would hide nothing: compare against the dequantized
    torch path)."""
    codes = torch.arange(256, dtype=torch.uint8).view(1, 16, 1, 16).repeat(1, 4, 2, 1)
    scales = torch.tensor([107, 127, 147, 120], dtype=torch.uint8).repeat_interleave(16)
    w13 = Mxfp4Experts(1, 64, 64, torch.float32, "cpu")
    w13.blocks.data = codes.reshape(1, 64, 2, 16).contiguous()
    w13.scales.data = scales.view(1, 64, 1).repeat(1, 1, 2).contiguous()
    w2 = packed_experts(torch.eye(64)[:, :32].unsqueeze(0).contiguous())
    routing = random_routing(3, 1, [0], seed=1)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(6)) * 1e-3
    want = experts_torch(x, w13, w2, routing, ACT)
    got = fused_mxfp4_experts(x, *routing, w13.packed, w2.packed, None, ACT.alpha, ACT.limit)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=2e-4)


def test_bad_shapes_and_ids_are_refused() -> None:
    w13, w2, biases = mxfp4_case(2, 32, 32, seed=1)
    routing = random_routing(2, 1, [0, 1], seed=2)
    args = (w13.packed, w2.packed, biases, 1.0, 7.0)
    with pytest.raises(ValueError, match="do not fit"):
        fused_mxfp4_experts(torch.zeros(2, 64), *routing, *args)
    with pytest.raises(ValueError, match="outside"):
        fused_mxfp4_experts(torch.zeros(2, 32), routing.weights, routing.ids + 5, *args)
    short = Mxfp4Tensors(w2.packed.codes, w2.packed.scales[:, :, :0])
    with pytest.raises(ValueError, match="scales"):
        fused_mxfp4_experts(torch.zeros(2, 32), *routing, w13.packed, short, None, 1.0, 7.0)
