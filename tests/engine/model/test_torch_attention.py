"""The torch and Triton backends over a quantized KV cache equal attention over the explicitly
dequantised K/V (and a quantized cache changes the answer: the reference is not the fp32 one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_attention import LONG, MIXED, SPECS, needs_triton, run_step
from tiny_llama import TRITON_DEVICE, chunk, make_runner, save_tiny_llama, step

from engine import cpu_kernels
from engine.model.attention import TritonAttention
from engine.model.backends import select_attention
from engine.model.torch_attention import TorchAttention


@pytest.mark.parametrize("path", ["torch", "c"])
@pytest.mark.parametrize("kv_dtype", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("group", [1, 3])
def test_quantized_cache_equals_dequantised_reference(kv_dtype: str, group: int, path: str) -> None:
    """Decodes take the C kernel on the "c" path where it reads the cache (int8)."""
    if path == "c" and not cpu_kernels.available():
        pytest.skip("no C compiler here")
    backend = TorchAttention(cpu_kernel=path == "c")
    out, expected, meta = run_step(MIXED, group, backend=backend, kv_dtype=kv_dtype)
    assert meta.num_decodes == 3
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    _, exact, _ = run_step(MIXED, group)
    if path == "c":  # the C kernel took the int8 decodes (it takes no fp8 cache)
        q, kv = torch.zeros(1, 2 * group, 16), torch.zeros(1, 1, 2, 4, 2, 24, dtype=torch.int8)
        assert cpu_kernels.supports(q, kv) and not cpu_kernels.supports(q, kv.float())
    assert not torch.allclose(expected, exact, atol=1e-4)  # quantisation shows


@pytest.mark.parametrize("path", ["torch", "c"])
@pytest.mark.parametrize("kv_dtype", ["int8", "fp8_e4m3"])
def test_quantized_cache_with_windows_and_softcap(kv_dtype: str, path: str) -> None:
    backend = TorchAttention(cpu_kernel=path == "c")
    out, expected, _ = run_step(LONG, 2, backend=backend, spec=SPECS["both"], kv_dtype=kv_dtype)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_quantized_cache_does_not_steer_the_backend_choice() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # cuda: named, never touched
    for kv_dtype in ("auto", "int8", "fp8_e4m3"):
        assert isinstance(select_attention("auto", cpu, kv_cache_dtype=kv_dtype), TorchAttention)
        assert isinstance(select_attention("torch", cuda, kv_cache_dtype=kv_dtype), TorchAttention)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        select_attention("auto", cpu, kv_cache_dtype="int4")
    needs_triton()
    for kv_dtype in ("auto", "int8", "fp8_e4m3"):
        assert isinstance(select_attention("triton", cpu, kv_cache_dtype=kv_dtype), TritonAttention)
        assert isinstance(select_attention("auto", cuda, kv_cache_dtype=kv_dtype), TritonAttention)


# Decodes and chunks after a cached prefix: the Triton kernels read every key from the cache,
# the torch backend a fresh prompt's from its fresh K/V, so fresh prompts are left out here.
CACHED = [(9, 8), (4, 3), (1, 0), (21, 16), (13, 5), (30, 29)]


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8_e4m3"])
def test_triton_backend_over_a_quantized_cache(kv_dtype: str) -> None:
    """The Triton kernels dequantize in registers what the torch writer quantized."""
    needs_triton()
    out, expected, meta = run_step(
        CACHED, 3, backend=TritonAttention(), device=TRITON_DEVICE, kv_dtype=kv_dtype
    )
    assert meta.num_decodes == 3
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_triton_runner_over_an_int8_cache_equals_the_torch_runner(tmp_path: Path) -> None:
    """A tiny model through the runner, every attention over cached keys (prompts start with
    a one-token step, which both backends read from the cache): the Triton path (fused RoPE +
    quantized write, dequantizing attention) gives the torch path's logits."""
    needs_triton()
    save_tiny_llama(tmp_path)
    a, c = [(7 * i + 3) % 128 for i in range(14)], [(3 * i + 1) % 128 for i in range(18)]
    ta, tc = (9, 2, 30, 17, 5, 41), (33, 8, 21, 1, 14, 50, 6)
    steps = [
        (chunk("a", a, 0, 1, ta, False), chunk("c", c, 0, 1, tc, False)),
        (chunk("a", a, 1, 13, ta, False), chunk("c", c, 1, 6, tc, False)),
        (chunk("c", c, 6, 18, tc), chunk("a", a, 13, 14, ta)),
    ]
    logits = {}
    for backend in ("torch", "triton"):
        device = str(TRITON_DEVICE) if backend == "triton" else "cpu"
        runner = make_runner(
            tmp_path, attention_backend=backend, kv_cache_dtype="int8", device=device
        )
        assert runner.kv_cache.dtype == torch.int8 and runner.kv_cache.shape[-1] == 16 + 8
        assert isinstance(runner.model.attention, TritonAttention) == (backend == "triton")
        logits[backend] = [step(runner, *s).cpu() for s in steps][-1]
    torch.testing.assert_close(logits["triton"], logits["torch"], atol=1e-4, rtol=0)
