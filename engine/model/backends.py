"""Choosing a step's attention backend: the torch one (CPU, the oracle) or the Triton
kernels (CUDA, or interpreted)."""

from __future__ import annotations

import torch

from engine.kv_format.dtypes import check_kv_cache_dtype
from engine.model.attention import AttentionBackend, TritonAttention
from engine.model.torch_attention import TorchAttention


def select_attention(
    name: str, device: torch.device, cpu_kernel: bool = True, kv_cache_dtype: str = "auto"
) -> AttentionBackend:
    """``torch``, ``triton``, or ``auto``: Triton on CUDA when it is importable, else torch.
    Every backend reads every ``kv_cache_dtype`` (the Triton kernels quantize int8 / fp8_e4m3
    rows as they write and dequantize them as they read), so it does not steer the choice;
    an unknown one is refused by name."""
    if name not in ("auto", "torch", "triton"):
        raise ValueError(f"attention backend must be auto, torch or triton, got {name!r}")
    check_kv_cache_dtype(kv_cache_dtype)
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TorchAttention(cpu_kernel)
    from engine.triton_kernels import triton_available

    if triton_available():
        return TritonAttention()
    if name == "triton":
        raise ValueError(
            "attention_backend 'triton' needs triton and a CUDA device (or TRITON_INTERPRET=1)"
        )
    return TorchAttention(cpu_kernel)
