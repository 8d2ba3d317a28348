"""The torch backend over a quantized KV cache equals attention over the explicitly dequantised
K/V (and a quantized cache changes the answer: the reference is not the fp32 one)."""

from __future__ import annotations

import pytest
import torch
from test_attention import LONG, MIXED, SPECS, run_step

from engine.model.backends import select_attention
from engine.model.torch_attention import TorchAttention


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("group", [1, 3])
def test_quantized_cache_equals_dequantised_reference(kv_dtype: str, group: int) -> None:
    backend = TorchAttention(cpu_kernel=True)  # a quantized cache never takes the C kernel
    out, expected, meta = run_step(MIXED, group, backend=backend, kv_dtype=kv_dtype)
    assert meta.num_decodes == 3
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    _, exact, _ = run_step(MIXED, group)
    assert not torch.allclose(expected, exact, atol=1e-4)  # quantisation shows


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8_e4m3"])
def test_quantized_cache_with_windows_and_softcap(kv_dtype: str) -> None:
    backend = TorchAttention(cpu_kernel=False)
    out, expected, _ = run_step(LONG, 2, backend=backend, spec=SPECS["both"], kv_dtype=kv_dtype)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_quantized_cache_selects_torch_and_refuses_triton() -> None:
    cpu = torch.device("cpu")
    assert isinstance(select_attention("auto", cpu, kv_cache_dtype="int8"), TorchAttention)
    with pytest.raises(ValueError, match="kv_cache_dtype int8"):
        select_attention("triton", cpu, kv_cache_dtype="int8")
