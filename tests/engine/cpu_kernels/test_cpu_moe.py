"""The C mixture-of-experts kernel equals the torch experts path (engine.model.moe) on the
edge cases a step produces (tests/engine/moe_cases.py), strided rows and bad input."""

from __future__ import annotations

import pytest
import torch
from moe_cases import CASES, random_experts, random_routing

from engine import cpu_kernels
from engine.cpu_kernels.moe import MAX_TOP_K, fused_experts, pack_experts
from engine.model.moe import experts_torch

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the CPU kernels need a C compiler (cc or $CC)"
)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_experts_equal_the_torch_path(case: str, activation: str) -> None:
    tokens, top_k, experts, chosen = CASES[case]
    h, i = 48, 32
    w13, w2 = random_experts(experts, h, i, seed=len(case))
    routing = random_routing(tokens, top_k, chosen, seed=len(case) + 1)
    x = torch.randn(tokens, h, generator=torch.Generator().manual_seed(2))
    packed = pack_experts(w13, w2)
    assert packed is not None
    want = experts_torch(x, w13, w2, routing, activation)
    got = fused_experts(x, *routing, packed, activation)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    residual = torch.randn(tokens, h)
    into = residual.clone()
    assert fused_experts(x, *routing, packed, activation, out=into) is into
    torch.testing.assert_close(into, residual + want, atol=1e-5, rtol=1e-5)


def test_a_large_step_equals_the_torch_path() -> None:
    """Enough rows that the gather and the weighted sum are shared out between threads too."""
    w13, w2 = random_experts(3, 512, 16, seed=13)
    packed = pack_experts(w13, w2)
    assert packed is not None
    routing = random_routing(300, 2, list(range(3)), seed=14)
    x = torch.randn(300, 512, generator=torch.Generator().manual_seed(15))
    want = experts_torch(x, w13, w2, routing, "gelu_tanh")
    got = fused_experts(x, *routing, packed, "gelu_tanh")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_tokens_result_does_not_depend_on_the_tokens_beside_it() -> None:
    """Bit for bit: one token alone or in a batch whose experts get many rows."""
    w13, w2 = random_experts(6, 32, 48, seed=5)
    packed = pack_experts(w13, w2)
    assert packed is not None
    routing = random_routing(40, 2, list(range(6)), seed=6)
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(7))
    batch = fused_experts(x, *routing, packed, "silu")
    for t in (0, 17, 39):
        one = slice(t, t + 1)
        alone = fused_experts(x[one], routing.weights[one], routing.ids[one], packed, "silu")
        assert torch.equal(alone[0], batch[t])


def test_strided_rows_are_read_in_place() -> None:
    w13, w2 = random_experts(4, 16, 16, seed=8)
    packed = pack_experts(w13, w2)
    assert packed is not None
    wide = torch.randn(5, 40)
    x = wide[:, 3:19]  # rows 40 floats apart
    routing = random_routing(5, 2, list(range(4)), seed=9)
    torch.testing.assert_close(
        fused_experts(x, *routing, packed, "silu"),
        experts_torch(x.contiguous(), w13, w2, routing, "silu"),
        atol=1e-5,
        rtol=1e-5,
    )


def test_bad_inputs_are_refused_by_name() -> None:
    w13, w2 = random_experts(4, 16, 16, seed=10)
    packed = pack_experts(w13, w2)
    assert packed is not None
    x = torch.randn(3, 16)
    routing = random_routing(3, 2, list(range(4)), seed=11)
    with pytest.raises(ValueError, match="expert id outside"):
        fused_experts(x, routing.weights, routing.ids + 3, packed, "silu")
    with pytest.raises(ValueError, match="top_k above"):
        k = MAX_TOP_K + 1
        fused_experts(x, torch.ones(3, k), torch.zeros(3, k, dtype=torch.int64), packed, "silu")
    with pytest.raises(ValueError, match="activation 'relu'"):
        fused_experts(x, *routing, packed, "relu")
    with pytest.raises(ValueError, match="does not fit H=16"):
        fused_experts(torch.randn(3, 32), *routing, packed, "silu")
    with pytest.raises(ValueError, match=r"\[3, k\] weights and ids"):
        fused_experts(x, routing.weights[:2], routing.ids[:2], packed, "silu")


def test_weights_the_kernel_does_not_take_are_not_packed() -> None:
    w13, w2 = random_experts(4, 16, 24, seed=12)  # intermediate not a multiple of 16
    assert pack_experts(w13, w2) is None
    w13, w2 = random_experts(4, 16, 16, seed=12)
    assert pack_experts(w13.double(), w2.double()) is None
