"""Choosing a step's attention backend: the torch one (CPU, the oracle) or the Triton
kernels (CUDA, or interpreted)."""

from __future__ import annotations

import torch

from engine.model.attention import AttentionBackend, TritonAttention
from engine.model.torch_attention import TorchAttention


def select_attention(
    name: str, device: torch.device, cpu_kernel: bool = True, kv_cache_dtype: str = "auto"
) -> AttentionBackend:
    """``torch``, ``triton``, or ``auto``: Triton on CUDA when it is importable, else torch.
    A quantized KV cache (``kv_cache_dtype`` int8 / fp8_e4m3) is read by the torch backend
    only: the Triton kernels take the model dtype's cache."""
    if name not in ("auto", "torch", "triton"):
        raise ValueError(f"attention backend must be auto, torch or triton, got {name!r}")
    if name == "triton" and kv_cache_dtype != "auto":
        raise ValueError(
            f"attention_backend 'triton' does not read a kv_cache_dtype {kv_cache_dtype} cache; "
            "use attention_backend torch (or auto)"
        )
    if name == "torch" or kv_cache_dtype != "auto" or (name == "auto" and device.type != "cuda"):
        return TorchAttention(cpu_kernel)
    from engine.triton_kernels import triton_available

    if triton_available():
        return TritonAttention()
    if name == "triton":
        raise ValueError(
            "attention_backend 'triton' needs triton and a CUDA device (or TRITON_INTERPRET=1)"
        )
    return TorchAttention(cpu_kernel)
