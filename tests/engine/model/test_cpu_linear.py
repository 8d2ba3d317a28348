"""The C linear kernel over packed weights gives F.linear's results; the runner can turn
it off."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny_llama import chunk, make_runner, save_tiny_llama, step

from engine import cpu_kernels
from engine.model import linear as cpu_linear

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the CPU kernels need a C compiler (cc or $CC)"
)


# rows: one, each remainder of the 6-row tiles, the panel walked in chunks of 64 inputs (7 to
# 47 rows), in one pass again (48), past one 512-row block; K: two whole chunks and a part
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 13, 32, 47, 48, 601])
def test_linear_and_add_linear_equal_torch(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 150, generator=gen)
    x = torch.randn(rows, 150, generator=gen)
    packed = cpu_linear.pack(w)
    assert packed is not None and packed.shape == (6, 150, 16)
    torch.testing.assert_close(cpu_linear.linear(x, w, packed), F.linear(x, w))
    h = torch.randn(rows, 96, generator=gen)
    want = h + x @ w.t()
    got = cpu_linear.add_linear_(h, x, w, packed)
    assert got.data_ptr() == h.data_ptr()  # in place
    torch.testing.assert_close(got, want)


def test_a_rows_product_does_not_depend_on_the_rows_beside_it() -> None:
    """Bit for bit, whichever path the call's row count takes: a request's logits do not
    change with the batch it is in (speculative verification relies on it: its guesses' rows
    must score as they would alone)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 200, generator=gen)
    x = torch.randn(60, 200, generator=gen)
    h = torch.randn(60, 64, generator=gen)
    packed = cpu_linear.pack(w)
    assert packed is not None
    alone = torch.cat([cpu_kernels.linear(x[i : i + 1], packed) for i in range(60)])
    added = torch.cat(
        [cpu_kernels.linear(x[i : i + 1], packed, h[i : i + 1].clone()) for i in range(60)]
    )
    for rows in (2, 6, 7, 12, 20, 47, 48, 60):
        assert torch.equal(cpu_kernels.linear(x[:rows], packed), alone[:rows]), rows
        assert torch.equal(cpu_kernels.linear(x[:rows], packed, h[:rows].clone()), added[:rows])


def test_weights_the_kernel_does_not_take_stay_on_torch() -> None:
    assert cpu_linear.pack(torch.randn(40, 8)) is None  # 40 outputs: not whole panels
    assert cpu_linear.pack(torch.randn(32, 8, dtype=torch.bfloat16)) is None
    w = torch.randn(32, 8)
    x = torch.randn(5, 16)[:, ::2]  # a strided input goes to F.linear
    torch.testing.assert_close(cpu_linear.linear(x, w, cpu_linear.pack(w)), F.linear(x, w))
    with pytest.raises(ValueError, match="does not fit a weight of 32x8"):
        cpu_kernels.linear(torch.randn(5, 9), cpu_linear.pack(w))  # type: ignore[arg-type]


def test_runner_packs_on_cpu_fp32_only_when_asked(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    packed = make_runner(tmp_path)
    assert packed.packed_weights
    layer = packed.model.decoder_layers()[0]
    assert layer.mlp is not None
    assert set(layer.attn.packed) | set(layer.mlp.packed) == {"qkv", "o_proj", "gate_up", "down"}
    plain = make_runner(tmp_path, pack_cpu_weights=False, cpu_kernels=False)
    assert not plain.packed_weights and not plain.model.decoder_layers()[0].attn.packed
    assert not plain.model.cpu_kernels
    assert not make_runner(tmp_path, dtype="bfloat16").packed_weights  # fp32 only


def test_fast_paths_equal_the_torch_paths(tmp_path: Path) -> None:
    """Prefill, a chunk over a cached prefix, and decodes mixed with a prefill: the packed
    weights and the C kernels give the logits of plain torch."""
    save_tiny_llama(tmp_path)
    fast = make_runner(tmp_path)
    plain = make_runner(tmp_path, pack_cpu_weights=False, cpu_kernels=False)
    assert fast.model.cpu_kernels == cpu_kernels.available()
    a = [(7 * i + 3) % 128 for i in range(21)]
    b = [(5 * i + 1) % 128 for i in range(9)]
    steps = [
        (chunk("a", a, 0, 12, (7, 3, 12, 40, 41, 42)),),
        (chunk("a", a, 12, 20, (7, 3, 12, 40, 41, 42)), chunk("b", b, 0, 8, (9, 10, 11))),
        (chunk("a", a, 20, 21, (7, 3, 12, 40, 41, 42)), chunk("b", b, 8, 9, (9, 10, 11))),
    ]
    for chunks in steps:
        torch.testing.assert_close(step(fast, *chunks), step(plain, *chunks), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fast.kv_cache, plain.kv_cache, rtol=1e-5, atol=1e-5)


def test_a_layer_moved_off_the_cpu_never_hands_the_c_kernel_its_activations() -> None:
    """The packed copy stays on the CPU when a layer moves to a GPU (the Triton MoE test moved
    a Qwen2-MoE block with a packed shared expert: the C kernel read GPU memory and took the
    process down). Off the CPU the product comes from the weight; the kernel refuses."""
    w = torch.randn(96, 150)
    packed = cpu_linear.pack(w)
    x = torch.empty(4, 150, device="meta")  # a device whose memory the C kernel cannot read
    assert cpu_linear.linear(x, w.to("meta"), packed).shape == (4, 96)
    h = torch.empty(4, 96, device="meta")
    assert cpu_linear.add_linear_(h, x, w.to("meta"), packed).shape == (4, 96)
    with pytest.raises(ValueError, match="CPU tensors"):
        cpu_kernels.linear(x, packed)
